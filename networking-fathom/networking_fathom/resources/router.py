"""Neutron routers -> fathom routers. The mode (distributed, fabric, network-node) is the router's L3
flavor: the fathom provider the flavor names (networking_fathom.l3) puts it in `fathom_mode`. The
external gateway (`external_gateway_info`: network, the address Neutron allocated, SNAT) is the
router's `external_gateway`; fathom picks the gateway node."""
from __future__ import annotations

from neutron_lib.plugins import constants as plugin_constants
from neutron_lib.plugins import directory

from .base import Mapping, ipv4


def mode_of(context, router_id: str) -> str | None:
    """The fathom mode of a router's provider; None when another provider (not fathom) owns it."""
    l3 = directory.get_plugin(plugin_constants.L3)
    try:
        provider = l3.l3_driver_controller.get_provider_for_router(context, router_id)
    except Exception:      # no association (being deleted) or no driver controller
        return None
    return getattr(provider, "fathom_mode", None)


class Router(Mapping):
    kind = "router"
    collection = "routers"
    order = 2
    mutable = ("name", "mode", "external_gateway")

    def wanted(self, obj, refs):
        mode = obj.get("fathom_mode")
        if mode is None:
            return None
        return {"name": (obj.get("name") or "")[:255], "mode": mode, "external_id": obj["id"],
                "external_gateway": gateway(obj.get("external_gateway_info"), refs)}

    def current(self, fathom_obj):
        gw = fathom_obj.get("external_gateway")
        return {**fathom_obj, "external_gateway": None if gw is None else {
            k: gw[k] for k in ("network_id", "ip_address", "enable_snat")}}

    def update(self, api, existing, changes, project):
        if existing.get("external_gateway") and changes.get("external_gateway") and \
                existing["external_gateway"]["network_id"] != changes["external_gateway"]["network_id"]:
            # another external network: the old gateway goes first (its address is not the new one's)
            api.request("PATCH", f"/{self.collection}/{existing['id']}", project, json={"external_gateway": None})
        return super().update(api, existing, changes, project)

    def delete(self, api, existing, project):
        # Neutron clears the gateway as it deletes the router; replayed together, the entries collapse
        # into the deletion, and fathom deletes no router that still has a gateway
        if existing.get("external_gateway"):
            api.request("PATCH", f"/{self.collection}/{existing['id']}", project, json={"external_gateway": None})
        super().delete(api, existing, project)

    def neutron_objects(self, context):
        l3 = directory.get_plugin(plugin_constants.L3)
        if l3 is None:
            return []
        return [{**r, "fathom_mode": mode_of(context, r["id"])} for r in l3.get_routers(context)]


def gateway(info: dict | None, refs) -> dict | None:
    """fathom's external_gateway for Neutron's external_gateway_info (its first IPv4 address)."""
    if not info or not info.get("network_id"):
        return None
    v4 = [f["ip_address"] for f in info.get("external_fixed_ips") or [] if ipv4(f["ip_address"])]
    return {"network_id": refs.id("networks", info["network_id"]), "ip_address": v4[0] if v4 else None,
            "enable_snat": info.get("enable_snat", True) is not False}
