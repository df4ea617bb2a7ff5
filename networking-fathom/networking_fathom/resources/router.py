"""Neutron routers -> fathom routers. The mode (distributed, fabric, network-node) is the router's L3
flavor: the fathom provider the flavor names (networking_fathom.l3) puts it in `fathom_mode`."""
from __future__ import annotations

from neutron_lib.plugins import constants as plugin_constants
from neutron_lib.plugins import directory

from .base import Mapping


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
    mutable = ("name", "mode")

    def wanted(self, obj, refs):
        mode = obj.get("fathom_mode")
        if mode is None:
            return None
        return {"name": (obj.get("name") or "")[:255], "mode": mode, "external_id": obj["id"]}

    def neutron_objects(self, context):
        l3 = directory.get_plugin(plugin_constants.L3)
        if l3 is None:
            return []
        return [{**r, "fathom_mode": mode_of(context, r["id"])} for r in l3.get_routers(context)]
