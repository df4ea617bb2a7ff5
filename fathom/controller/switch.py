"""Talking to one switch: read its flows and groups, apply a change atomically."""
from __future__ import annotations

import itertools

import os_ken.app.ofctl.api as ofctl
from os_ken.app.ofctl.exception import OFError

from fathom.openflow import encode
from fathom.openflow.spec import FlowSpec, GroupSpec

_bundle_ids = itertools.count(1)


class ApplyError(Exception):
    pass


def read_flows(app, dp) -> set[FlowSpec]:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    req = parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch())
    replies = ofctl.send_msg(app, req, reply_cls=parser.OFPFlowStatsReply, reply_multi=True) or []
    return {encode.decode_flow(ofp, stat) for r in replies for stat in r.body}


def read_flow_stats(app, dp) -> list:
    """Raw os-ken flow stats (with counters), for status and metrics."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    req = parser.OFPFlowStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch())
    replies = ofctl.send_msg(app, req, reply_cls=parser.OFPFlowStatsReply, reply_multi=True) or []
    return [stat for r in replies for stat in r.body]


def read_groups(app, dp) -> set[GroupSpec]:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    req = parser.OFPGroupDescStatsRequest(dp, 0)
    replies = ofctl.send_msg(app, req, reply_cls=parser.OFPGroupDescStatsReply, reply_multi=True) or []
    return {encode.decode_group(ofp, d) for r in replies for d in r.body}


def apply(app, dp, messages: list) -> None:
    """Send messages as one atomic bundle (OpenFlow 1.4+), or in order followed by a barrier.

    Bundle adds are pipelined (no round trip each); the commit reply, after them on the same
    connection, tells whether the switch took the whole change. An error on any add fails it all.
    """
    if not messages:
        return
    ofp, parser = dp.ofproto, dp.ofproto_parser
    try:
        if ofp.OFP_VERSION >= 0x05:
            bid = next(_bundle_ids) & 0xFFFFFFFF
            flags = ofp.OFPBF_ATOMIC | ofp.OFPBF_ORDERED
            ctrl = lambda t: parser.OFPBundleCtrlMsg(dp, bid, t, flags, [])
            ofctl.send_msg(app, ctrl(ofp.OFPBCT_OPEN_REQUEST), reply_cls=parser.OFPBundleCtrlMsg)
            xids = []
            for m in messages:
                add = parser.OFPBundleAddMsg(dp, bid, flags, m, [])
                dp.set_xid(add)
                xids.append(add.xid)
                dp.send_msg(add)
            try:
                ofctl.send_msg(app, ctrl(ofp.OFPBCT_COMMIT_REQUEST), reply_cls=parser.OFPBundleCtrlMsg)
            except OFError:
                errors = app.take_errors(dp.id, xids)
                raise OFError(result=errors[0] if errors else None)
            errors = app.take_errors(dp.id, xids)
            if errors:
                raise OFError(result=errors[0])
        else:
            for m in messages:
                ofctl.send_msg(app, m)
    except OFError as e:
        raise ApplyError(f"switch {dp.id:016x} refused the change: {e}") from e


def diff(desired_flows: set[FlowSpec], desired_groups: set[GroupSpec], actual_flows: set[FlowSpec],
         actual_groups: set[GroupSpec], owned) -> tuple[list, list, list, list, list]:
    """What to change so the switch holds exactly the desired flows and groups it owns.

    Returns (flows to add or replace, flows to delete, groups to add, groups to modify, groups to
    delete). `owned(cookie)` tells which actual flows are ours; a group is ours by its id.
    """
    actual_by_key = {f.key: f for f in actual_flows}
    desired_by_key = {f.key: f for f in desired_flows}
    put = [f for k, f in desired_by_key.items() if actual_by_key.get(k) != f]
    delete = [f for k, f in actual_by_key.items() if k not in desired_by_key and owned(f.cookie)]
    actual_g = {g.group_id: (g.type, g.buckets) for g in actual_groups}
    add_g, mod_g = [], []
    for g in desired_groups:
        have = actual_g.get(g.group_id)
        if have is None:
            add_g.append(g)
        elif have != (g.type, g.buckets):
            mod_g.append(g)
    desired_ids = {g.group_id for g in desired_groups}
    del_g = [g for g in actual_groups if g.group_id not in desired_ids and owned(None, group_id=g.group_id)]
    return put, delete, add_g, mod_g, del_g


def messages(dp, put, delete, add_g, mod_g, del_g) -> list:
    """Order matters: groups exist before the flows that use them, and outlive them on delete."""
    return ([encode.group_mod(dp, g, "add") for g in add_g] + [encode.group_mod(dp, g, "modify") for g in mod_g]
            + [encode.flow_mod(dp, f) for f in put] + [encode.flow_mod(dp, f, delete=True) for f in delete]
            + [encode.group_mod(dp, g, "delete") for g in del_g])
