"""A port's counters, read from its node's br-int over OpenFlow (a port stats request for the port's
OpenFlow port number) when asked: packets, bytes, drops and errors of its OVS interface as the switch
counts them (rx: what the switch received from the port, i.e. what the VM sent; tx: what the switch
sent to it), with the time they were read. Nothing is polled or kept.
"""
from __future__ import annotations

from datetime import datetime, timezone

from fathom.controller import switch as sw
from fathom.model import datapath_id

FIELDS = ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped", "rx_errors", "tx_errors")


def read_port_stats(app, dp, port_no: int) -> dict | None:
    """{field: count} of OpenFlow port `port_no` (FIELDS), None when the switch does not know it;
    TimeoutError when it does not answer within STATS_REPLY_TIMEOUT."""
    parser = dp.ofproto_parser
    replies = sw.send_waiting(app, parser.OFPPortStatsRequest(dp, 0, port_no), parser.OFPPortStatsReply,
                              sw.STATS_REPLY_TIMEOUT, multi=True) or []
    for r in replies:
        for stat in r.body:
            if stat.port_no == port_no:
                return {f: getattr(stat, f) for f in FIELDS}
    return None


def port_counters(reconciler, port_id: int) -> dict:
    """{node, interface, ofport, read_at, counters, reason}: `counters` None, and `reason` why, when
    they cannot be read (the port is on no node, its interface is not on br-int, the switch is not
    connected or does not answer)."""
    out = {"port_id": port_id, "node": None, "interface": None, "ofport": None, "read_at": None,
           "counters": None, "reason": None}
    model = reconciler.model
    port = next((p for p in model.ports if p.id == port_id), None) if model is not None else None
    node = next((n for n in model.nodes if n.name == port.node), None) if port is not None else None
    if node is None:
        return {**out, "reason": "not bound to a node (or not yet compiled)"}
    ofport = node.ofport(port.interface)
    out.update(node=node.name, interface=port.interface, ofport=ofport)
    if ofport is None:
        return {**out, "reason": f"interface {port.interface} is not on {node.name}'s br-int"}
    app = reconciler.switches.app
    dp = app.datapath(datapath_id(node.id))
    if dp is None:
        return {**out, "reason": f"the switch of {node.name} is not connected"}
    try:
        counters = read_port_stats(app, dp, ofport)
    except Exception as e:  # noqa: BLE001 - the connection went while asking: said, not raised
        return {**out, "reason": f"the switch of {node.name} did not answer: {type(e).__name__}"}
    if counters is None:
        return {**out, "reason": f"the switch of {node.name} did not report port {ofport}"}
    return {**out, "counters": counters, "read_at": datetime.now(timezone.utc).isoformat()}
