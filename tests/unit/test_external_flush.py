"""The controller flushes exactly the conntrack zones whose NAT mapping changed (fathom/controller/external.py),
after their new flows are on the gateway node, with the message OVS reads (NXT_CT_FLUSH_ZONE)."""
from __future__ import annotations

import struct
from dataclasses import replace
from types import SimpleNamespace

from os_ken.ofproto import ofproto_v1_4 as ofp
from os_ken.ofproto import ofproto_v1_4_parser as parser

from fathom.apps import BR_INT, SwitchKey
from fathom.controller.external import ExternalRuntime, zone_mappings

from .test_compiler_external import cloud


class Datapath:
    ofproto, ofproto_parser, id = ofp, parser, 3

    def __init__(self):
        self.sent = []

    def set_xid(self, msg):
        msg.xid = 1

    def send_msg(self, msg):
        msg.serialize()
        self.sent.append(bytes(msg.buf))


def _pass(runtime, snapshot, dp, state="ok"):
    rec = SimpleNamespace(switches=SimpleNamespace(app=SimpleNamespace(datapath=lambda dpid: dp)))
    result = SimpleNamespace(switches={SwitchKey(BR_INT, "gw"): SimpleNamespace(state=state)})
    runtime.after_pass(rec, snapshot, result)


def zones(dp) -> list[int]:
    out = []
    for buf in dp.sent:
        experimenter, exp_type = struct.unpack_from("!II", buf, 8)
        assert (experimenter, exp_type) == (0x2320, 29) and buf[16:22] == bytes(6)
        out.append(struct.unpack_from("!H", buf, 22)[0])
    return out


def test_only_the_zone_of_a_moved_floating_ip_is_flushed_once_its_flows_are_there():
    snap, dp, runtime = cloud(), Datapath(), ExternalRuntime()
    assert set(zone_mappings(snap)) == {("gw", 0x8000), ("gw", 0x8001), ("gw", 0x8002)}
    _pass(runtime, snap, dp)
    _pass(runtime, snap, dp)
    assert zones(dp) == []                                  # nothing changed: nothing flushed
    moved = replace(snap, floating_ips=(replace(snap.floating_ips[0], port_id=22, fixed_ip="10.0.0.6"),))
    _pass(runtime, moved, dp, state="not connected")
    assert zones(dp) == []                                  # the gateway node does not hold the new flows yet
    _pass(runtime, moved, dp)
    assert zones(dp) == [0x8002]
    _pass(runtime, moved, dp)
    assert zones(dp) == [0x8002]                            # once
    gone = replace(moved, floating_ips=())                  # deleted: its zone is flushed too
    _pass(runtime, gone, dp)
    assert zones(dp) == [0x8002, 0x8002]
