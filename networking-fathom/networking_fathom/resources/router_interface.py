"""Router interfaces: a Neutron port owned by a router (`device_owner` network:router_interface,
`device_id` the router) -> fathom's `POST /v1/routers/{id}/interfaces` on the port's IPv4 subnet and
address. fathom keeps an interface as a port with `router_id`, keyed by the Neutron port's UUID."""
from __future__ import annotations

from neutron_lib.plugins import directory

from .base import Mapping, ipv4
from .port import ROUTER_INTERFACE_OWNERS


class RouterInterface(Mapping):
    kind = "router_interface"
    collection = "ports"
    order = 4
    immutable = ("router_id", "subnet_id", "ip_address", "mac_address")
    mutable = ()

    def wanted(self, obj, refs):
        if (obj.get("device_owner") or "") not in ROUTER_INTERFACE_OWNERS or not obj.get("device_id"):
            return None
        v4 = [f for f in obj.get("fixed_ips", []) if ipv4(f["ip_address"])]
        if not v4:
            return None
        return {"router_id": refs.id("routers", obj["device_id"]),
                "subnet_id": refs.id("subnets", v4[0]["subnet_id"]),
                "ip_address": v4[0]["ip_address"], "mac_address": obj["mac_address"], "external_id": obj["id"]}

    def is_mine(self, fathom_obj):
        return fathom_obj.get("router_id") is not None

    def current(self, fathom_obj):
        ip = fathom_obj["fixed_ips"][0] if fathom_obj.get("fixed_ips") else {}
        return {"router_id": fathom_obj.get("router_id"), "subnet_id": ip.get("subnet_id"),
                "ip_address": ip.get("ip_address"), "mac_address": fathom_obj.get("mac_address")}

    def create(self, api, body, project):
        return api.request("POST", f"/routers/{body['router_id']}/interfaces", project,
                           json={k: body[k] for k in ("subnet_id", "ip_address", "mac_address", "external_id")})

    def update(self, api, existing, changes, project):
        raise AssertionError("router interfaces are replaced, never updated")

    def delete(self, api, existing, project):
        api.request("DELETE", f"/routers/{existing['router_id']}/interfaces/{existing['id']}", project)

    def neutron_objects(self, context):
        return directory.get_plugin().get_ports(context, filters={"device_owner": list(ROUTER_INTERFACE_OWNERS)})
