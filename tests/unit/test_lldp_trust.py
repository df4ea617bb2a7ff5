"""Which LLDP frames may teach the controller a fabric link: only a signed, fresh probe from a node's
br-phy underlay port, received on a ToR port. Runs the fabric runtime's packet-in handler against a
real store."""
import time
import warnings
from types import SimpleNamespace
from unittest import mock

import pytest

from fathom.controller.fabric import FabricRuntime, lldp_parse, lldp_probe
from fathom.model import datapath_id_phy, datapath_id_tor
from fathom.store.db import open_store, session_factory

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

from .auth import headers_for  # noqa: E402

UL0 = 1          # ul0's port on br-phy
TOR_PORT = 7     # the ToR port facing node c1 in this test ("c1-port")


@pytest.fixture
def fabric(tmp_path):
    url = f"sqlite:///{tmp_path / 'fathom.db'}"
    app = create_app(url)
    http = TestClient(app, headers=headers_for(app))
    node = http.post("/v1/nodes", json={"name": "c1", "tunnel_ip": "10.0.0.1", "management_ip": "10.1.0.1"}).json()
    sw = http.post("/v1/fabric/switches", json={"name": "tor1", "management_ip": "10.1.0.9"}).json()
    rt = FabricRuntime(None, session_factory(open_store(url)), 6653, lambda: None)
    rt.tor_ports = {sw["id"]: {"c1-port": TOR_PORT, "other": 8}}
    rt.phy_ports = {node["id"]: UL0}

    def links():
        got = http.get(f"/v1/fabric/switches/{sw['id']}").json()["links"]
        return {(x["port_name"], x["node"]) for x in got if x["source"] == "lldp"}
    return SimpleNamespace(rt=rt, node=node["id"], sw=sw["id"], links=links)


def packet_in(rx_dpid: int, in_port: int, data: bytes):
    return SimpleNamespace(data=data, datapath=SimpleNamespace(id=rx_dpid), match={"in_port": in_port})


def test_a_signed_probe_from_br_phy_on_a_tor_port_is_a_link(fabric):
    probe = lldp_probe(datapath_id_phy(fabric.node), UL0, fabric.rt._lldp_key)
    assert fabric.rt.on_packet_in(packet_in(datapath_id_tor(fabric.sw), TOR_PORT, probe))
    assert fabric.links() == {("c1-port", "c1")}


def forged(fabric) -> dict[str, tuple[int, int, bytes]]:
    """(receiving dpid, in_port, frame) of every frame that must teach nothing."""
    phy, tor = datapath_id_phy(fabric.node), datapath_id_tor(fabric.sw)
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
        # a ToR's own probe coming back to a ToR port (the ToR is no node)
        "from a tor": (tor, TOR_PORT, lldp_probe(tor, 8, key)),
        # a valid probe punted by br-phy, where tenant VLAN traffic arrives too
        "received by br-phy": (phy, UL0, lldp_probe(tor, TOR_PORT, key)),
        # from br-phy but not out of the underlay port we probe
        "not from ul0": (tor, TOR_PORT, lldp_probe(phy, 5, key)),
        # received by a bridge that is neither (a node's br-int)
        "received by br-int": (0xFA00_0000_0000_0000 | fabric.node, 3, signed),
    }


@pytest.mark.parametrize("case", ["unsigned", "another key", "stale", "sender rewritten", "from a tor",
                                  "received by br-phy", "not from ul0", "received by br-int"])
def test_other_lldp_frames_teach_nothing(fabric, case):
    rx, port, frame = forged(fabric)[case]
    assert fabric.rt.on_packet_in(packet_in(rx, port, frame))   # consumed, not passed on
    assert fabric.links() == set()


def test_parse_without_a_key_reads_any_probe_and_with_one_only_signed_ones():
    key = b"s" * 32
    assert lldp_parse(lldp_probe(datapath_id_tor(3), 7)) == (datapath_id_tor(3), 7)
    assert lldp_parse(lldp_probe(datapath_id_tor(3), 7), key) is None
    assert lldp_parse(lldp_probe(datapath_id_tor(3), 7, key), key) == (datapath_id_tor(3), 7)
