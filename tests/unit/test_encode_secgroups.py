"""Round trips of the spec additions security groups need (ct, ct_clear, conjunction; ct_state,
ct_zone, ct_mark, ct_label, conj_id, IPv6 and ICMP matches) through os-ken's OpenFlow 1.4 classes:
the flow_mod is serialised to bytes as the reconciler sends it and parsed back as a switch's reply
would be."""
from types import SimpleNamespace

from os_ken.ofproto import ofproto_parser
from os_ken.ofproto import ofproto_v1_4 as ofp
from os_ken.ofproto import ofproto_v1_4_parser as parser

from fathom.openflow import encode
from fathom.openflow.spec import Conjunction, Ct, CtClear, FlowSpec, GotoTable, SetField, ct_state

DP = SimpleNamespace(ofproto=ofp, ofproto_parser=parser, id=1)

FLOWS = [
    FlowSpec(32, 100, {"reg5": 3, "eth_type": 0x0800}, (Ct(zone_field="reg5", table=34),), 0x601),
    FlowSpec(72, 100, {"reg7": 3, "eth_type": 0x86DD},
             (CtClear(), SetField("reg9", 7), Ct(zone_field="reg9", table=74)), 0x601),
    FlowSpec(34, 190, {"ct_state": ct_state(new=False, trk=True), "ct_mark": 5},
             (Conjunction(0x80000001, 2, 2),), 0x601),
    FlowSpec(34, 190, {"reg5": 3}, (Conjunction(7, 1, 3), Conjunction(8, 1, 2)), 0x601),
    FlowSpec(34, 100, {"conj_id": 5, "eth_type": 0x0800},
             (Ct(zone_field="reg5", commit=True, exec=(SetField("ct_mark", 5),)), GotoTable(40)), 0x601),
    FlowSpec(34, 100, {"eth_type": 0x0800, "ip_proto": 1, "icmpv4_type": 8, "icmpv4_code": 0},
             (Conjunction(7, 3, 3),), 0x601),
    FlowSpec(34, 100, {"eth_type": 0x86DD, "ipv6_src": ("fd00::", "ffff:ffff::")}, (Conjunction(8, 2, 3),), 0x601),
    FlowSpec(34, 100, {"eth_type": 0x0800, "ip_proto": 6, "tcp_dst": (0x50, 0xFFF0)}, (Conjunction(5, 3, 3),), 0x601),
    FlowSpec(34, 100, {}, (Ct(zone=9, commit=True),), 0x601),
]


def _round_trip(flow: FlowSpec) -> FlowSpec:
    mod = encode.flow_mod(DP, flow)
    mod.serialize()
    back = ofproto_parser.msg(DP, ofp.OFP_VERSION, ofp.OFPT_FLOW_MOD, len(mod.buf), 0, bytes(mod.buf))
    stat = SimpleNamespace(table_id=back.table_id, priority=back.priority, cookie=back.cookie,
                           match=back.match, instructions=back.instructions)
    return encode.decode_flow(ofp, stat)


def test_security_group_flows_round_trip():
    for flow in FLOWS:
        assert _round_trip(flow) == flow, flow.to_ofctl()


def test_ct_state_renders_as_ovs_prints_it():
    assert FLOWS[2].to_ofctl() == ("cookie=0x601, table=34, priority=190,ct_state=-new+trk,ct_mark=0x5 "
                                   "actions=conjunction(2147483649,2/2)")
    assert FLOWS[4].to_ofctl().endswith("actions=ct(commit,zone=NXM_NX_REG5[0..15],exec(set_field:0x5->ct_mark)),"
                                        "goto_table:40")


def test_every_compiled_security_group_flow_round_trips():
    """What the reconciler reads back from a switch equals what it wanted: else it would rewrite the
    flows on every pass."""
    from fathom.apps.secgroups.compiler import compile_secgroups

    from .test_compiler_secgroups import cloud
    flows = [f for state in compile_secgroups(cloud()).values() for f in state.flows]
    assert len(flows) > 100
    for flow in flows:
        assert _round_trip(flow) == flow, flow.to_ofctl()
