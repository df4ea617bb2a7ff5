"""Neutron networks -> fathom networks: type and segmentation id from Neutron's (single) segment."""
from __future__ import annotations

from neutron_lib.plugins import directory

from .base import Mapping

TYPES = ("vxlan", "vlan", "flat")


def segment(obj: dict) -> tuple[str | None, int | None]:
    """(network_type, segmentation_id) of a network with one segment; (None, None) otherwise."""
    segments = obj.get("segments")
    if segments:
        if len(segments) != 1:
            return None, None
        s = segments[0]
        return s.get("provider:network_type"), s.get("provider:segmentation_id")
    return obj.get("provider:network_type"), obj.get("provider:segmentation_id")


class Network(Mapping):
    kind = "network"
    collection = "networks"
    order = 0
    immutable = ("type", "segmentation_id")

    def wanted(self, obj, refs):
        network_type, segmentation_id = segment(obj)
        if network_type not in TYPES:
            return None       # geneve, local, multi-segment: not fathom's (docs/openstack.md)
        body = {"name": (obj.get("name") or "")[:255], "type": network_type, "external_id": obj["id"]}
        if network_type != "flat":
            body["segmentation_id"] = segmentation_id
        return body

    def neutron_objects(self, context):
        return directory.get_plugin().get_networks(context)
