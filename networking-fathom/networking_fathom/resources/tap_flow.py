"""TaaS tap flows -> fathom vTAP policies: the tap service's port is the monitor, `vlan_filter` (one
VLAN id) the policy's `vlan`, and the direction gives sender and receiver:

    OUT   sender = the flow's source port, receiver "*"   everything the port sends (its switch's tap-ingress)
    IN    sender "*", receiver = the source port          everything it receives (its switch's tap-egress)
    BOTH  sender = the source port, receiver "*", direction both: both tap points, one policy

A flow with a VLAN range in `vlan_filter` is left unmapped and marked ERROR in TaaS by
networking_fathom.taas."""
from __future__ import annotations

from neutron_lib.api.definitions import taas as taas_api
from neutron_lib.plugins import directory

from .base import Mapping

ANY = "*"
# TaaS direction -> (sender is the source port, policy direction)
DIRECTIONS = {"OUT": (True, "forward"), "IN": (False, "forward"), "BOTH": (True, "both")}


def supported(flow: dict) -> str | None:
    """Why fathom cannot hold this tap flow (None: it can)."""
    if flow.get("direction") not in DIRECTIONS:
        return f"direction {flow.get('direction')!r}: TaaS directions are {', '.join(DIRECTIONS)}"
    vlan = flow.get("vlan_filter")
    if vlan not in (None, "") and not str(vlan).isdigit():
        return f"vlan_filter {vlan!r}: fathom filters on one VLAN id"
    return None


class TapFlow(Mapping):
    kind = "tap_flow"
    collection = "taps"
    order = 5
    immutable = ("sender", "receiver", "monitor", "direction", "vlan")
    mutable = ("name",)

    def wanted(self, obj, refs):
        if supported(obj) is not None or not obj.get("tap_service_port"):
            return None
        vlan = obj.get("vlan_filter")
        port = refs.id("ports", obj["source_port"])
        sends, direction = DIRECTIONS[obj["direction"]]
        return {"name": (obj.get("name") or "")[:255], "sender": port if sends else ANY,
                "receiver": ANY if sends else port, "monitor": refs.id("ports", obj["tap_service_port"]),
                "direction": direction, "vlan": int(vlan) if vlan not in (None, "") else None,
                "external_id": obj["id"]}

    def current(self, t):
        def end(e):
            return ANY if e.get("mac") == ANY else e.get("port_id")
        return {"name": t["name"], "sender": end(t["sender"]), "receiver": end(t["receiver"]),
                "monitor": t["monitor"]["port_id"], "direction": t["direction"], "vlan": t["filters"].get("vlan")}

    def neutron_objects(self, context):
        taas = directory.get_plugin(taas_api.ALIAS)
        if taas is None:
            return []
        services = {s["id"]: s["port_id"] for s in taas.get_tap_services(context)}
        return [{**f, "tap_service_port": services.get(f["tap_service_id"])} for f in taas.get_tap_flows(context)]
