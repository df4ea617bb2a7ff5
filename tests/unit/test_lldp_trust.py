"""Which LLDP frames may teach the controller a fabric link: only a signed, fresh probe from a node's
br-phy underlay port, received on a fabric switch port. Runs the fabric runtime's packet-in handler against a
real store."""
import time
import warnings
from types import SimpleNamespace
from unittest import mock

import pytest

from fathom.controller.fabric import FabricRuntime, lldp_parse, lldp_probe
from fathom.model import datapath_id_phy, datapath_id_fabric
from fathom.store.db import open_store, session_factory

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

from .auth import headers_for  # noqa: E402

UL0 = 1          # ul0's port on br-phy
TOR_PORT = 7     # the fabric switch port facing node c1 in this test ("c1-port")


@pytest.fixture
def fabric(tmp_path):
    url = f"sqlite:///{tmp_path / 'fathom.db'}"
    app = create_app(url)
    http = TestClient(app, headers=headers_for(app))
    node = http.post("/v1/nodes", json={"name": "c1", "tunnel_ip": "10.0.0.1", "management_ip": "10.1.0.1"}).json()
    sw = http.post("/v1/fabric/switches", json={"name": "tor1", "management_ip": "10.1.0.9"}).json()
    rt = FabricRuntime(None, session_factory(open_store(url)), 6653, lambda: None)
    rt.fabric_ports = {sw["id"]: {"c1-port": TOR_PORT, "other": 8}}
    rt.phy_ports = {node["id"]: UL0}

    def written():          # the links the handler handed on are in the store
        rt._links.submit(lambda: None).result(10)

    def links():
        written()
        got = http.get(f"/v1/fabric/switches/{sw['id']}").json()["links"]
        return {(x["port_name"], x["node"]) for x in got if x["source"] == "lldp"}

    def http_links():
        written()
        return http.get(f"/v1/fabric/switches/{sw['id']}").json()["links"]
    return SimpleNamespace(rt=rt, node=node["id"], sw=sw["id"], links=links, http_links=http_links, url=url)


def packet_in(rx_dpid: int, in_port: int, data: bytes):
    return SimpleNamespace(data=data, datapath=SimpleNamespace(id=rx_dpid), match={"in_port": in_port})


def test_a_signed_probe_from_br_phy_on_a_tor_port_is_a_link(fabric):
    probe = lldp_probe(datapath_id_phy(fabric.node), UL0, fabric.rt._lldp_key)
    assert fabric.rt.on_packet_in(packet_in(datapath_id_fabric(fabric.sw), TOR_PORT, probe))
    assert fabric.links() == {("c1-port", "c1")}


def forged(fabric) -> dict[str, tuple[int, int, bytes]]:
    """(receiving dpid, in_port, frame) of every frame that must teach nothing."""
    phy, tor = datapath_id_phy(fabric.node), datapath_id_fabric(fabric.sw)
    key = fabric.rt._lldp_key
    with mock.patch("fathom.controller.fabric.time.time", return_value=time.time() - 60):
        stale = lldp_probe(phy, UL0, key)
    signed = lldp_probe(phy, UL0, key)
    tampered = signed.replace(b"fathom:%016x" % phy, b"fathom:%016x" % datapath_id_phy(fabric.node + 1))
    return {
        "unsigned": (tor, TOR_PORT, lldp_probe(phy, UL0)),
        "another key": (tor, TOR_PORT, lldp_probe(phy, UL0, b"k" * 32)),
        "stale": (tor, TOR_PORT, stale),
        "sender rewritten": (tor, TOR_PORT, tampered),
        # a fabric switch's own probe coming back to a fabric switch port (the fabric switch is no node)
        "from a fabric switch": (tor, TOR_PORT, lldp_probe(tor, 8, key)),
        # a valid probe punted by br-phy, where tenant VLAN traffic arrives too
        "received by br-phy": (phy, UL0, lldp_probe(tor, TOR_PORT, key)),
        # from br-phy but not out of the underlay port we probe
        "not from ul0": (tor, TOR_PORT, lldp_probe(phy, 5, key)),
        # received by a bridge that is neither (a node's br-int)
        "received by br-int": (0xFA00_0000_0000_0000 | fabric.node, 3, signed),
    }


@pytest.mark.parametrize("case", ["unsigned", "another key", "stale", "sender rewritten", "from a fabric switch",
                                  "received by br-phy", "not from ul0", "received by br-int"])
def test_other_lldp_frames_teach_nothing(fabric, case):
    rx, port, frame = forged(fabric)[case]
    assert fabric.rt.on_packet_in(packet_in(rx, port, frame))   # consumed, not passed on
    assert fabric.links() == set()


def test_parse_without_a_key_reads_any_probe_and_with_one_only_signed_ones():
    key = b"s" * 32
    assert lldp_parse(lldp_probe(datapath_id_fabric(3), 7)) == (datapath_id_fabric(3), 7)
    assert lldp_parse(lldp_probe(datapath_id_fabric(3), 7), key) is None
    assert lldp_parse(lldp_probe(datapath_id_fabric(3), 7, key), key) == (datapath_id_fabric(3), 7)


def _probing(interval: float):
    """A fabric runtime's LLDP loop, running, with every round of probes counted."""
    import threading

    from fathom.model import datapath_id
    rt = FabricRuntime(None, None, 6653, lambda: None, lldp_interval=interval)
    rounds = []
    rt.send_lldp = lambda: rounds.append(time.monotonic()) or 0
    threading.Thread(target=rt._lldp_loop, daemon=True).start()
    return rt, rounds, datapath_id


def test_lldp_probes_when_the_underlay_wiring_may_have_changed_and_rarely_otherwise():
    from fathom.controller.fabric import LLDP_SETTLE
    rt, rounds, br_int = _probing(interval=60)
    try:
        time.sleep(0.3)
        rt.wiring_event(br_int(1))                 # a br-int's port-status: not the underlay
        time.sleep(LLDP_SETTLE + 0.5)
        assert rounds == []
        for dpid in (datapath_id_fabric(1), datapath_id_phy(2)):
            before = len(rounds)
            sent = time.monotonic()
            rt.wiring_event(dpid)
            rt.wiring_event(dpid)                  # events close together: one round
            time.sleep(LLDP_SETTLE + 1.5)
            assert len(rounds) == before + 1 and rounds[-1] - sent >= LLDP_SETTLE - 0.01
    finally:
        rt.stop()


def test_lldp_probes_every_interval_with_no_event():
    rt, rounds, _ = _probing(interval=0.3)
    started = time.monotonic()
    try:
        time.sleep(1.2)
    finally:
        rt.stop()
    assert len(rounds) >= 2 and rounds[0] - started >= 0.29
    assert all(b - a >= 0.29 for a, b in zip(rounds, rounds[1:])), rounds


def test_a_known_link_is_written_again_only_after_the_refresh_interval(fabric):
    from fathom.controller.fabric import LLDP_REFRESH
    probe = lldp_probe(datapath_id_phy(fabric.node), UL0, fabric.rt._lldp_key)

    def seen():
        return fabric.http_links()[0]["last_seen"]
    fabric.rt.on_packet_in(packet_in(datapath_id_fabric(fabric.sw), TOR_PORT, probe))
    first = seen()
    fabric.rt.on_packet_in(packet_in(datapath_id_fabric(fabric.sw), TOR_PORT, probe))
    assert seen() == first
    later = time.monotonic() + LLDP_REFRESH
    with mock.patch("fathom.controller.fabric.time.monotonic", return_value=later):
        fabric.rt.on_packet_in(packet_in(datapath_id_fabric(fabric.sw), TOR_PORT, probe))
    assert seen() > first


def test_the_packet_in_handler_does_not_wait_for_the_store(fabric):
    """The handler runs on the OpenFlow app's event thread, which every switch's events share (bundle
    commit replies, role statuses): a link's write waiting for the store must not hold it."""
    import sqlite3
    import threading
    probe = lldp_probe(datapath_id_phy(fabric.node), UL0, fabric.rt._lldp_key)
    blocker = sqlite3.connect(fabric.url.removeprefix("sqlite:///"), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")          # another writer holds the store
    try:
        handler = threading.Thread(target=fabric.rt.on_packet_in,
                                   args=(packet_in(datapath_id_fabric(fabric.sw), TOR_PORT, probe),), daemon=True)
        handler.start()
        handler.join(5)
        assert not handler.is_alive()            # returned while the write waits
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert fabric.links() == {("c1-port", "c1")}
