"""Every compiled spec survives os-ken: encode to an OpenFlow 1.3 flow-mod / group-mod, serialise to
bytes, parse the bytes back and decode: the result equals the spec. A difference here would make
the reconciler rewrite a flow on every pass (churn)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser

from fathom.openflow import encode
from .flowsim import compile_tenant

from .test_compiler_tenant import cloud, random_cloud

FLOW_MOD_MATCH_OFFSET = ofp.OFP_HEADER_SIZE + 40   # the match follows the flow-mod's fixed part
GROUP_MOD_BUCKETS_OFFSET = ofp.OFP_HEADER_SIZE + 8  # command, type, pad, group_id, then buckets


class FakeDatapath:
    ofproto = ofp
    ofproto_parser = parser
    id = 1

    def set_xid(self, msg):
        msg.xid = 1


def _round_trip_flow(dp, flow):
    msg = encode.flow_mod(dp, flow)
    msg.serialize()
    buf = bytes(msg.buf)
    match = parser.OFPMatch.parser(buf, FLOW_MOD_MATCH_OFFSET)
    pos = FLOW_MOD_MATCH_OFFSET + match.length + (-match.length % 8)
    instructions = []
    while pos < len(buf):
        inst = parser.OFPInstruction.parser(buf, pos)
        instructions.append(inst)
        pos += inst.len
    stat = SimpleNamespace(instructions=instructions, match=match, table_id=flow.table,
                           priority=flow.priority, cookie=flow.cookie)
    return encode.decode_flow(ofp, stat)


@pytest.mark.parametrize("snapshot", [cloud(), *(random_cloud(seed) for seed in range(6))])
def test_compiled_specs_round_trip_through_os_ken(snapshot):
    dp = FakeDatapath()
    for state in compile_tenant(snapshot).values():
        for flow in state.flows:
            assert _round_trip_flow(dp, flow) == flow
        for group in state.groups:
            assert _round_trip_group(dp, group) == group


def _round_trip_group(dp, group):
    msg = encode.group_mod(dp, group, "add")
    msg.serialize()
    buf = bytes(msg.buf)
    buckets, pos = [], GROUP_MOD_BUCKETS_OFFSET
    while pos < len(buf):
        bucket = parser.OFPBucket.parser(buf, pos)
        buckets.append(bucket)
        pos += bucket.len
    desc = SimpleNamespace(group_id=group.group_id, type=msg.type, buckets=buckets)
    return encode.decode_group(ofp, desc)


def test_flow_mods_from_kept_parts_are_os_kens_bytes():
    """encode.flow_mod_bytes (a flow-mod put together from parts encoded once) gives exactly the
    bytes os-ken serialises, for every flow of every shipped topology and variant, add and delete,
    in OpenFlow 1.3 and 1.4: also when the parts come from the cache (a second round)."""
    from os_ken.ofproto import ofproto_v1_4, ofproto_v1_4_parser

    from . import golden_flows

    class Datapath14(FakeDatapath):
        ofproto = ofproto_v1_4
        ofproto_parser = ofproto_v1_4_parser

    flows = {f for _, _, states in golden_flows.scenarios() for state in states.values() for f in state.flows}
    assert len(flows) > 1000
    encode._FIELD_CACHE.clear()
    encode._INSTRUCTIONS_CACHE.clear()
    for _ in range(2):
        for dp in (FakeDatapath(), Datapath14()):
            for flow in flows:
                for delete in (False, True):
                    msg = encode.flow_mod(dp, flow, delete=delete)
                    msg.xid = 0
                    msg.serialize()
                    assert encode.flow_mod_bytes(dp, flow, delete=delete) == bytes(msg.buf), (flow, delete)
