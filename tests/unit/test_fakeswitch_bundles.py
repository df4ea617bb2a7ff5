"""A bundle is all or nothing on the switches that stand in for OVS: the in-memory switch the unit
tests drive (FakeSwitch) and the simulated switches of `fathom bench scale` behind a real TCP
connection (OFSwitch). A refused message takes back every change of the bundle before it (flows
added, replaced and deleted, groups modified) and nothing else; the switch keeps working."""
from __future__ import annotations

import socket
import struct

import pytest
from os_ken.ofproto import ofproto_v1_4 as ofp

from fathom.bench.ofswitch import HEADER, OFSwitch
from fathom.controller.fakeswitch import FakeDatapath, FakeSwitch
from fathom.controller.switch import ApplyError
from fathom.openflow import encode
from fathom.openflow.spec import FlowSpec, GotoTable, Group, GroupSpec, Output

from .ofwire import read_message

A = FlowSpec(0, 100, {"in_port": 1}, (Output(2),), cookie=1)
A2 = FlowSpec(0, 100, {"in_port": 1}, (Output(3),), cookie=1)     # A's table, priority and match
B = FlowSpec(0, 100, {"in_port": 2}, (GotoTable(1),), cookie=2)
BAD = FlowSpec(0, 100, {"in_port": 3}, (Group(99),), cookie=3)       # group 99 does not exist
G = GroupSpec(7, "all", ((Output(1),), (Output(2),)))
G2 = GroupSpec(7, "all", ((Output(1),),))


def _state(sw: FakeSwitch):
    return sw.read_flows(), sw.read_groups()


def test_a_refused_bundle_leaves_the_fake_switch_as_it_was():
    sw = FakeSwitch(1)
    sw.plain([(G, encode.group_mod(sw.dp, G, "add")), (A, encode.flow_mod(sw.dp, A))])
    before = _state(sw)
    def changes():   # delete A, add B, add A2 (A's key again), modify G; fresh messages each time
        return [(A, encode.flow_mod(sw.dp, A, delete=True)), (B, encode.flow_mod(sw.dp, B)),
                (A2, encode.flow_mod(sw.dp, A2)), (G2, encode.group_mod(sw.dp, G2, "modify"))]
    with pytest.raises(ApplyError):
        sw.bundle(changes() + [(BAD, encode.flow_mod(sw.dp, BAD))])
    assert _state(sw) == before == ({A}, {G})
    sw.bundle(changes())                                 # the same changes without the bad one
    assert _state(sw) == ({B, A2}, {G2})


# ------------------------------------------------------------------ the simulated switch over TCP

def _wire(msg, xid: int) -> bytes:
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def _control(xid: int, bundle_id: int, kind: int) -> bytes:
    body = struct.pack("!IHH", bundle_id, kind, ofp.OFPBF_ATOMIC)
    return HEADER.pack(ofp.OFP_VERSION, ofp.OFPT_BUNDLE_CONTROL, HEADER.size + len(body), xid) + body


def _add(xid: int, bundle_id: int, inner: bytes) -> bytes:
    body = struct.pack("!I2xH", bundle_id, ofp.OFPBF_ATOMIC) + inner
    return HEADER.pack(ofp.OFP_VERSION, ofp.OFPT_BUNDLE_ADD_MESSAGE, HEADER.size + len(body), xid) + body


def _bundle(conn, bundle_id: int, specs: list, first_xid: int) -> list[tuple[int, int, bytes]]:
    """Open, add `specs` (FlowSpec, or (GroupSpec, command)), commit; the answers after the open's."""
    dp = FakeDatapath(1)
    conn.sendall(_control(first_xid, bundle_id, ofp.OFPBCT_OPEN_REQUEST))
    assert read_message(conn)[:2] == (ofp.OFPT_BUNDLE_CONTROL, first_xid)
    for i, spec in enumerate(specs, 1):
        msg = encode.group_mod(dp, *spec) if isinstance(spec, tuple) else encode.flow_mod(dp, spec)
        conn.sendall(_add(first_xid + i, bundle_id, _wire(msg, first_xid + i)))
    commit = first_xid + len(specs) + 1
    conn.sendall(_control(commit, bundle_id, ofp.OFPBCT_COMMIT_REQUEST))
    answers = [read_message(conn)]
    if answers[0][0] == ofp.OFPT_ERROR:                  # the refused add's error, then the commit's
        answers.append(read_message(conn))
    return answers


def test_a_refused_bundle_leaves_the_simulated_switch_as_it_was():
    with socket.create_server(("127.0.0.1", 0)) as server:
        sw = OFSwitch(5, server.getsockname())
        conn, _ = server.accept()
        try:
            assert read_message(conn)[0] == ofp.OFPT_HELLO
            assert _bundle(conn, 1, [(G, "add"), A], 10)[0][0] == ofp.OFPT_BUNDLE_CONTROL
            before = (dict(sw.tables.flows), dict(sw.tables.groups), dict(sw.raw_flows), dict(sw.raw_groups))

            changes = [(G2, "modify"), B, A2]
            answers = _bundle(conn, 2, changes + [BAD], 20)
            (err_type, xid_add, _), (commit_type, xid_commit, body) = answers
            assert err_type == ofp.OFPT_ERROR and xid_add == 24          # the fourth add: BAD
            assert commit_type == ofp.OFPT_ERROR and xid_commit == 25
            assert struct.unpack_from("!HH", body) == (ofp.OFPET_BUNDLE_FAILED, ofp.OFPBFC_MSG_FAILED)
            assert (sw.tables.flows, sw.tables.groups, sw.raw_flows, sw.raw_groups) == before

            assert _bundle(conn, 3, changes, 30)[0][:2] == (ofp.OFPT_BUNDLE_CONTROL, 34)
            assert set(sw.tables.flows.values()) == {B, A2} and set(sw.tables.groups.values()) == {G2}
            assert set(sw.raw_flows) == {B.key, A2.key} and set(sw.raw_groups) == {7}
            assert sw.raw_flows[A.key] != before[2][A.key]                # A2's actions replaced A's
        finally:
            conn.close()
            sw.close()
