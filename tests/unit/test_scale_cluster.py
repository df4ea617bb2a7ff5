"""`fathom bench scale`'s cluster part: its reading of the lease shares (fair: every switch held by
a live replica, the counts differing by one at most), and the simulated switch's roles as OVS keeps
them (generation_id, stale requests, a new master demoting the old one, a slave's writes refused)."""
from __future__ import annotations

import socket
import struct

from os_ken.ofproto import ofproto_v1_4 as ofp

from fathom.bench.ofswitch import HEADER, NO_GENERATION, OFSwitch
from fathom.bench.scale.cluster import balance

from .ofwire import read_message


def _status(held: dict[str, int], live: set[str], masterless: int = 0, epoch: int = 1) -> dict:
    leases = [{"switch": f"{i:016x}", "holder": r, "epoch": epoch}
              for i, r in enumerate(r for r, n in held.items() for _ in range(n))]
    leases += [{"switch": f"f{i:015x}", "holder": None, "epoch": epoch} for i in range(masterless)]
    return {"replicas": [{"id": r, "live": r in live} for r in held], "leases": leases}


def test_shares_are_fair_when_every_switch_has_a_live_master_and_the_counts_differ_by_one_at_most():
    three = {"a", "b", "c"}
    assert balance(_status({"a": 34, "b": 33, "c": 33}, three))["fair"]
    assert not balance(_status({"a": 35, "b": 33, "c": 32}, three))["fair"]
    assert not balance(_status({"a": 34, "b": 33, "c": 32}, three, masterless=1))["fair"]
    # a replica no longer live: its leases count as masterless, and it has no share
    gone = balance(_status({"a": 50, "b": 25, "c": 25}, {"a", "b"}))
    assert (gone["live"], gone["masterless"], gone["fair"]) == (2, 25, False)
    assert balance(_status({"a": 50, "b": 50}, {"a", "b"}, epoch=3))["epochs"] == 300
    assert not balance({"replicas": [], "leases": []})["fair"]
    # fair among the leases made so far is not fair while switches have none yet
    assert balance(_status({"a": 29, "b": 28, "c": 28}, three))["fair"]
    assert not balance(_status({"a": 29, "b": 28, "c": 28}, three), switches=100)["fair"]
    assert balance(_status({"a": 34, "b": 33, "c": 33}, three), switches=100)["fair"]


def _role(conn: socket.socket, xid: int, role: int, generation: int) -> tuple[int, int, bytes]:
    body = struct.pack("!I4xQ", role, generation)
    conn.sendall(HEADER.pack(ofp.OFP_VERSION, ofp.OFPT_ROLE_REQUEST, HEADER.size + len(body), xid) + body)
    return read_message(conn)


def _flow_mod(conn: socket.socket, xid: int) -> None:
    from fathom.controller.fakeswitch import FakeDatapath
    from fathom.openflow import encode
    from fathom.openflow.spec import FlowSpec, Output
    msg = encode.flow_mod(FakeDatapath(1), FlowSpec(0, 100, {"in_port": 1}, (Output(2),), cookie=1))
    msg.set_xid(xid)
    msg.serialize()
    conn.sendall(bytes(msg.buf))


def test_the_simulated_switch_keeps_roles_as_ovs_does():
    with socket.create_server(("127.0.0.1", 0)) as one, socket.create_server(("127.0.0.1", 0)) as two:
        sw = OFSwitch(7)
        sw.set_targets([one.getsockname(), two.getsockname()])
        a, _ = one.accept()
        b, _ = two.accept()
        a.settimeout(10)                 # a request left unanswered fails the test
        b.settimeout(10)
        try:
            assert read_message(a)[0] == read_message(b)[0] == ofp.OFPT_HELLO
            # no generation_id yet; a new connection is equal
            kind, _, body = _role(a, 1, ofp.OFPCR_ROLE_NOCHANGE, 0)
            assert (kind, struct.unpack("!I4xQ", body)) == (ofp.OFPT_ROLE_REPLY, (ofp.OFPCR_ROLE_EQUAL, NO_GENERATION))
            assert struct.unpack("!I4xQ", _role(a, 2, ofp.OFPCR_ROLE_MASTER, 5)[2]) == (ofp.OFPCR_ROLE_MASTER, 5)
            # an older generation_id is refused as stale
            kind, xid, body = _role(b, 3, ofp.OFPCR_ROLE_MASTER, 4)
            assert (kind, xid, struct.unpack_from("!HH", body)) == (
                ofp.OFPT_ERROR, 3, (ofp.OFPET_ROLE_REQUEST_FAILED, ofp.OFPRRFC_STALE))
            # a newer one makes b master; a is told by a role status and becomes slave
            assert struct.unpack("!I4xQ", _role(b, 4, ofp.OFPCR_ROLE_MASTER, 6)[2]) == (ofp.OFPCR_ROLE_MASTER, 6)
            kind, _, body = read_message(a)
            assert (kind, struct.unpack("!IB3xQ", body)) == (
                ofp.OFPT_ROLE_STATUS, (ofp.OFPCR_ROLE_SLAVE, ofp.OFPCRR_MASTER_REQUEST, 6))
            assert sw.roles() == {"generation": 6, "connections": 2, "masters": 1}
            # the slave's write is refused; the master's is applied
            _flow_mod(a, 5)
            kind, xid, body = read_message(a)
            assert (kind, xid, struct.unpack_from("!HH", body)) == (
                ofp.OFPT_ERROR, 5, (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_IS_SLAVE))
            _flow_mod(b, 6)
            b.sendall(HEADER.pack(ofp.OFP_VERSION, ofp.OFPT_BARRIER_REQUEST, HEADER.size, 7))
            assert read_message(b)[:2] == (ofp.OFPT_BARRIER_REPLY, 7) and len(sw.tables.flows) == 1
        finally:
            a.close()
            b.close()
            sw.close()
