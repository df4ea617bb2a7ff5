"""Conntrack hygiene of external connectivity: a floating IP moved or removed leaves no stale NAT state.

The NAT of a router (its SNAT) and of each floating IP lives in OVS conntrack on the gateway node,
each in its own zone (fathom/apps/external). When a floating IP moves to another port, its existing
connections still hold the old mapping: a flow that keeps sending (a ping, a UDP stream with a fixed
source port) would keep reaching the old port for as long as it stays alive, whatever the new flows
say. So after every pass this extension compares what each zone maps now with what it mapped after
the last pass, and flushes every zone whose mapping changed or went away on the node that held it
(the Nicira `NXT_CT_FLUSH_ZONE` message, as `ovs-ofctl ct-flush-zone` sends it). The flush comes
after the pass has installed the new flows, so the next packet of an old connection is tracked
afresh under the new mapping. Only zones fathom allocated are flushed (fathom.store.external_models).

A controller restarted between a move and its pass does not know the old mapping and flushes
nothing (docs/external.md, limits).
"""
from __future__ import annotations

import logging
import struct

from fathom.apps import BR_INT, SwitchKey
from fathom.apps.external.compiler import unsupported_gateways
from fathom.controller.extension import Extension
from fathom.model import Snapshot, datapath_id

LOG = logging.getLogger("fathom.external")

NX_VENDOR_ID = 0x00002320
NXT_CT_FLUSH_ZONE = 29


def zone_mappings(snapshot: Snapshot) -> dict[tuple[str, int], tuple]:
    """(gateway node, conntrack zone) -> what the zone's NAT maps, for every zone in use."""
    skip = unsupported_gateways(snapshot)
    gateways = {g.router_id: g for g in snapshot.router_gateways if g.node and g.router_id not in skip}
    out = {}
    for g in gateways.values():
        out[(g.node, g.ct_zone)] = ("snat", g.router_id, g.ip_address, g.snat)
    for f in snapshot.floating_ips:
        g = gateways.get(f.router_id)
        if g is not None and f.port_id is not None:
            out[(g.node, f.ct_zone)] = ("floating_ip", f.id, f.ip_address, f.port_id, f.fixed_ip)
    return out


def flush_zone_message(dp, zone: int):
    """NXT_CT_FLUSH_ZONE: every conntrack entry of `zone` on the switch's datapath."""
    return dp.ofproto_parser.OFPExperimenter(dp, NX_VENDOR_ID, NXT_CT_FLUSH_ZONE, struct.pack("!6xH", zone))


class ExternalRuntime(Extension):
    def __init__(self):
        self.held: dict[tuple[str, int], tuple] = {}   # what each zone mapped after the last pass
        self.flushed = 0

    def install(self, reconciler) -> None:
        reconciler.extensions.append(self)

    def prepare(self, rec, snapshot, result):
        return snapshot

    def after_pass(self, rec, snapshot, result) -> None:
        now = zone_mappings(snapshot)
        nodes = {n.name: n for n in snapshot.nodes}
        keep = {}
        for (node, zone), old in self.held.items():
            if now.get((node, zone)) == old:
                continue
            res = result.switches.get(SwitchKey(BR_INT, node))
            app = getattr(rec.switches, "app", None)
            dp = app.datapath(datapath_id(nodes[node].id)) if app is not None and node in nodes else None
            if res is None or res.state != "ok" or dp is None:
                if node in nodes:
                    keep[(node, zone)] = old   # the new flows are not there yet: flush on a later pass
                continue
            dp.send_msg(flush_zone_message(dp, zone))
            self.flushed += 1
            LOG.info("node %s: flushed conntrack zone %d (%s %s changed)", node, zone, old[0], old[1])
        self.held = {**now, **keep}
