"""Neutron floating IPs -> fathom floating IPs (docs/external.md): the address Neutron allocated on
the external network, and the port (and which of its fixed IPs) it maps to; associating,
disassociating and moving are a PATCH of `port_id`. The router is fathom's to find (the one with an
interface on the port's subnet and a gateway on the external network), as Neutron finds it."""
from __future__ import annotations

from neutron_lib.plugins import constants as plugin_constants
from neutron_lib.plugins import directory

from .base import Mapping


def fip_data(fip) -> dict:
    """A Neutron floating IP (DB row or object, as the L3 callbacks give it) as the API shows it."""
    def text(value):
        return None if value is None else str(value)
    return {"id": fip.id, "project_id": fip.project_id, "floating_network_id": fip.floating_network_id,
            "floating_ip_address": text(fip.floating_ip_address), "port_id": fip.fixed_port_id,
            "fixed_ip_address": text(fip.fixed_ip_address)}


class FloatingIp(Mapping):
    kind = "floating_ip"
    collection = "floatingips"
    order = 6
    immutable = ("floating_network_id", "floating_ip_address")
    mutable = ("port_id", "fixed_ip_address")

    def wanted(self, obj, refs):
        port = obj.get("port_id")
        return {"floating_network_id": refs.id("networks", obj["floating_network_id"]),
                "floating_ip_address": obj["floating_ip_address"],
                "port_id": refs.id("ports", port) if port else None,
                "fixed_ip_address": obj.get("fixed_ip_address") if port else None,
                "external_id": obj["id"]}

    def update(self, api, existing, changes, project):
        # the port and its address move together (a new port's address is not the old one's)
        return api.request("PATCH", f"/{self.collection}/{existing['id']}", project,
                           json={"port_id": changes.get("port_id", existing["port_id"]),
                                 "fixed_ip_address": changes.get("fixed_ip_address", existing["fixed_ip_address"])})

    def neutron_objects(self, context):
        l3 = directory.get_plugin(plugin_constants.L3)
        return l3.get_floatingips(context) if l3 is not None else []
