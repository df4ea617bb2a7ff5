"""Runtime side of vTAP: per-policy counters and per-node state read from the switches, and the
Prometheus collector behind /metrics (the routes: fathom.api.runtime).

Counters come from OpenFlow itself: the policy's group at the tap point (the sender's edge; the receiver's for
a sender of "*") counts, per bucket,
what was matched (bucket 1, the original) and what was copied (bucket 2.., one per monitor); the
recovery flow at the monitor's edge counts the copies delivered. Both are read on request.
"""
from __future__ import annotations

import logging

from fathom.apps import BR_INT
from fathom.controller import switch as sw
from fathom.model import datapath_id
from fathom.openflow.spec import Output, OutputTrunc
from fathom.pipeline import stages as st
from fathom.apps.vtap import compiler as vtap
from fathom.store import models as m

LOG = logging.getLogger("fathom.vtap")


def read_group_stats(app, dp) -> dict[int, dict]:
    """{group id: {"packets", "bytes", "buckets": [(packets, bytes), ...]}} of every group."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    req = parser.OFPGroupStatsRequest(dp, 0, ofp.OFPG_ALL)
    replies = sw.send_waiting(app, req, parser.OFPGroupStatsReply, sw.STATS_REPLY_TIMEOUT, multi=True) or []
    out = {}
    for r in replies:
        for g in r.body:
            out[g.group_id] = {"packets": g.packet_count, "bytes": g.byte_count,
                               "buckets": [(b.packet_count, b.byte_count) for b in g.bucket_stats]}
    return out


def policy_stats(reconciler, policy_id: int) -> dict:
    """Counters and state of one policy on every node that must hold part of it."""
    cookie = vtap.tap_cookie(policy_id)
    desired = {key.name: state for key, state in reconciler.last.desired.items() if key.bridge == BR_INT}
    nodes = []
    totals = {"matched_packets": 0, "copies_packets": 0, "copies_bytes": 0, "delivered_packets": 0,
              "delivered_bytes": 0}
    with reconciler.Session() as s:
        node_ids = {n.name: n.id for n in s.query(m.Node)}
    for name, state in sorted(desired.items()):
        flows = [f for f in state.flows if f.cookie == cookie]
        groups = [g for g in state.groups if g.cookie == cookie]
        if not flows and not groups:
            continue
        roles = []
        if any(f.table == st.TAP_INGRESS for f in flows):
            roles.append("sender edge")
        if any(f.table == st.TAP_EGRESS for f in flows):
            roles.append("receiver edge")
        recovery = [f for f in flows if f.table == st.TAP_RECOVERY and f.actions
                    and isinstance(f.actions[-1], (Output, OutputTrunc)) and not _is_tunnel_send(f)]
        if recovery:
            roles.append("monitor edge")
        entry = {"node": name, "roles": roles, "flows_desired": len(flows), "flows_installed": 0,
                 "groups_desired": len(groups), "groups_installed": 0,
                 "switch": (reconciler.last.nodes.get(name).switch if reconciler.last.nodes.get(name)
                            else "unknown")}
        dp = reconciler.switches.app.datapath(datapath_id(node_ids[name])) if name in node_ids else None
        if dp is None:
            entry["switch"] = "not connected"
            nodes.append(entry)
            continue
        try:
            stats = sw.read_flow_stats(reconciler.switches.app, dp)
            entry["flows_installed"] = sum(1 for x in stats if x.cookie == cookie)
            delivered = [x for x in stats if x.cookie == cookie and x.table_id == st.TAP_RECOVERY
                         and any(_same(x, f) for f in recovery)]
            if recovery:
                entry["delivered_packets"] = sum(x.packet_count for x in delivered)
                entry["delivered_bytes"] = sum(x.byte_count for x in delivered)
                totals["delivered_packets"] += entry["delivered_packets"]
                totals["delivered_bytes"] += entry["delivered_bytes"]
            if groups:
                gstats = read_group_stats(reconciler.switches.app, dp)
                mine = [gstats[g.group_id] for g in groups if g.group_id in gstats]
                entry["groups_installed"] = len(mine)
                entry["matched_packets"] = sum(g["buckets"][0][0] for g in mine if g["buckets"])
                entry["copies_packets"] = sum(p for g in mine for p, _ in g["buckets"][1:])
                entry["copies_bytes"] = sum(b for g in mine for _, b in g["buckets"][1:])
                entry["per_monitor"] = [[p for p, _ in g["buckets"][1:]] for g in mine]
                for k in ("matched_packets", "copies_packets", "copies_bytes"):
                    totals[k] += entry[k]
        except Exception as e:  # noqa: BLE001 - reported per node
            entry["switch"] = f"error: {e}"
        nodes.append(entry)
    ok = bool(nodes) and all(n["switch"] == "ok" and n["flows_installed"] >= n["flows_desired"]
                             and n["groups_installed"] >= n["groups_desired"] for n in nodes)
    return {"policy": policy_id, "realised": ok, "nodes": nodes, **totals}


def _is_tunnel_send(flow) -> bool:
    return any(getattr(a, "field", None) == "tunnel_id" for a in flow.actions)


def _same(stat, flow) -> bool:
    return stat.priority == flow.priority and dict(stat.match._fields2).get(st.REG_TAP) == flow.match_dict.get(st.REG_TAP)


class TapCollector:
    """Prometheus collector: reads every policy's counters at scrape time."""

    def __init__(self, reconciler):
        self.reconciler = reconciler

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        matched = CounterMetricFamily("fathom_tap_matched_packets", "Packets matched by a tap policy (originals)",
                                      labels=["policy", "name", "node"])
        copies = CounterMetricFamily("fathom_tap_copies_packets", "Copies made by a tap policy",
                                     labels=["policy", "name", "node"])
        copies_b = CounterMetricFamily("fathom_tap_copies_bytes", "Bytes of copies made by a tap policy",
                                       labels=["policy", "name", "node"])
        delivered = CounterMetricFamily("fathom_tap_delivered_packets", "Copies delivered to a monitor",
                                        labels=["policy", "name", "node"])
        realised = GaugeMetricFamily("fathom_tap_realised", "1 if every switch holds the policy",
                                     labels=["policy", "name"])
        try:
            with self.reconciler.Session() as s:
                taps = [(t.id, t.name) for t in s.query(m.TapPolicy)]
            for pid, name in taps:
                stats = policy_stats(self.reconciler, pid)
                realised.add_metric([str(pid), name], 1 if stats["realised"] else 0)
                for n in stats["nodes"]:
                    labels = [str(pid), name, n["node"]]
                    if "copies_packets" in n:
                        matched.add_metric(labels, n["matched_packets"])
                        copies.add_metric(labels, n["copies_packets"])
                        copies_b.add_metric(labels, n["copies_bytes"])
                    if "delivered_packets" in n:
                        delivered.add_metric(labels, n["delivered_packets"])
        except Exception:  # noqa: BLE001 - a scrape must not fail the endpoint
            LOG.exception("tap metrics")
        yield from (matched, copies, copies_b, delivered, realised)
