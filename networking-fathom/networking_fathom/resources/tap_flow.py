"""TaaS tap flows -> fathom vTAP policies: the flow's source port is the sender, the tap service's
port the monitor, the receiver "*" (everything the port sends); `vlan_filter` (one VLAN id) is the
policy's `vlan`. Only direction OUT maps: fathom taps where traffic enters the fabric (the sender's
edge), and has no tap point yet for what a port receives (IN, BOTH); such flows are left unmapped and
marked ERROR in TaaS by networking_fathom.taas."""
from __future__ import annotations

from neutron_lib.api.definitions import taas as taas_api
from neutron_lib.plugins import directory

from .base import Mapping


def supported(flow: dict) -> str | None:
    """Why fathom cannot hold this tap flow (None: it can)."""
    if flow.get("direction") != "OUT":
        return f"direction {flow.get('direction')}: fathom copies what a port sends (OUT) only, so far"
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
        return {"name": (obj.get("name") or "")[:255], "sender": refs.id("ports", obj["source_port"]),
                "receiver": "*", "monitor": refs.id("ports", obj["tap_service_port"]), "direction": "forward",
                "vlan": int(vlan) if vlan not in (None, "") else None, "external_id": obj["id"]}

    def current(self, t):
        receiver = "*" if t["receiver"].get("mac") == "*" else t["receiver"].get("port_id")
        return {"name": t["name"], "sender": t["sender"]["port_id"], "receiver": receiver,
                "monitor": t["monitor"]["port_id"], "direction": t["direction"], "vlan": t["filters"].get("vlan")}

    def neutron_objects(self, context):
        taas = directory.get_plugin(taas_api.ALIAS)
        if taas is None:
            return []
        services = {s["id"]: s["port_id"] for s in taas.get_tap_services(context)}
        return [{**f, "tap_service_port": services.get(f["tap_service_id"])} for f in taas.get_tap_flows(context)]
