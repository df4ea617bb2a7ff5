"""Neutron subnets -> fathom subnets (IPv4 only: fathom's address plan is IPv4)."""
from __future__ import annotations

from neutron_lib.plugins import directory

from .base import Mapping


class Subnet(Mapping):
    kind = "subnet"
    collection = "subnets"
    order = 1
    immutable = ("network_id", "cidr", "gateway_ip")

    def wanted(self, obj, refs):
        if obj.get("ip_version") != 4:
            return None
        return {"network_id": refs.id("networks", obj["network_id"]), "cidr": obj["cidr"],
                "gateway_ip": obj.get("gateway_ip") or None, "name": (obj.get("name") or "")[:255],
                "external_id": obj["id"]}

    def neutron_objects(self, context):
        return directory.get_plugin().get_subnets(context)
