"""Round trips of the spec additions vTAP needs (meter instruction, output with max_len, meters)
through os-ken's OpenFlow 1.4 classes: encode as the reconciler does, decode as a switch reply is."""
from types import SimpleNamespace

from os_ken.ofproto import ofproto_v1_4 as ofp
from os_ken.ofproto import ofproto_v1_4_parser as parser

from fathom.openflow import encode
from fathom.openflow.spec import FlowSpec, LoadReg, Meter, MeterSpec, Output, OutputTrunc, SetField

DP = SimpleNamespace(ofproto=ofp, ofproto_parser=parser, id=1)


def test_metered_truncating_flow_round_trips():
    flow = FlowSpec(70, 100, {"reg8": 0xF00008, "eth_type": 0x0800},
                    (Meter(0x3000001), SetField("eth_dst", "02:fa:00:00:01:02"), SetField("ipv4_dst", "198.19.1.12"),
                     OutputTrunc(4, 96)), 0x308000000000001)
    mod = encode.flow_mod(DP, flow)
    assert type(mod.instructions[0]).__name__ == "OFPInstructionMeter"
    stat = SimpleNamespace(table_id=70, priority=100, cookie=flow.cookie, match=mod.match, instructions=mod.instructions)
    mod.match.serialize(bytearray(), 0)   # os-ken fills _fields2 on (de)serialisation
    back = encode.decode_flow(ofp, SimpleNamespace(**{**stat.__dict__, "match": parser.OFPMatch.parser(
        _serialised(mod.match), 0)}))
    assert back == flow
    assert flow.to_ofctl().endswith("actions=meter:50331649,set_field:02:fa:00:00:01:02->eth_dst,"
                                    "set_field:198.19.1.12->ip_dst,output(port=4,max_len=96)")


def test_meter_round_trips():
    m = MeterSpec(0x3000001, 1000, 100, "pktps")
    mod = encode.meter_mod(DP, m, "add")
    config = SimpleNamespace(meter_id=mod.meter_id, flags=mod.flags, bands=mod.bands)
    assert encode.decode_meter(ofp, config).key == m.key
    assert encode.meter_mod(DP, m, "delete").bands == []


def test_plain_flow_unchanged_by_meter_support():
    flow = FlowSpec(10, 1100, {"reg5": 1}, (LoadReg("reg8", 5), Output(3)))
    assert flow.meter_id() is None and flow.apply_actions() == flow.actions


def _serialised(match) -> bytes:
    buf = bytearray()
    match.serialize(buf, 0)
    return bytes(buf)
