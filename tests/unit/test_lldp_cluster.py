"""LLDP link discovery in a cluster: a br-phy's master sends the probes out of its underlay port, and
whichever replica masters the fabric switch that receives one verifies it, with the key the replicas
share in PostgreSQL (fathom.cluster.leases.shared_key). Real PostgreSQL, the fabric runtime's real
sender and packet-in handler; the switches stand in as datapaths that record what they are sent."""
from __future__ import annotations

import warnings
from types import SimpleNamespace

from os_ken.ofproto import ofproto_v1_4, ofproto_v1_4_parser

from fathom.cluster import leases
from fathom.controller.fabric import FabricRuntime, lldp_parse
from fathom.model import datapath_id_fabric, datapath_id_phy
from fathom.store.db import open_store, session_factory

from .auth import headers_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

UL0 = 1          # ul0's port on each br-phy
TOR_PORTS = {"c1": 7, "c2": 8}


class Datapath:
    """A connected switch as the OpenFlow app hands it out: what it is sent is kept."""
    ofproto, ofproto_parser = ofproto_v1_4, ofproto_v1_4_parser

    def __init__(self, dpid: int):
        self.id, self.sent = dpid, []

    def send_msg(self, msg) -> None:
        self.sent.append(msg)


def replica(url: str, key: bytes, masters: set[int], datapaths: dict[int, Datapath], nodes, switch) -> FabricRuntime:
    rt = FabricRuntime(SimpleNamespace(datapath=datapaths.get), session_factory(open_store(url)), 6653,
                       lambda: None, lldp_key=key)
    rt.reconciler = SimpleNamespace(cluster=SimpleNamespace(masters=lambda dpid: dpid in masters))
    rt.phy_ports = {n: UL0 for n in nodes.values()}
    rt.fabric_ports = {switch: dict(TOR_PORTS)}
    return rt


def test_a_probe_sent_by_a_br_phy_master_is_a_link_on_the_fabric_switch_master(postgres):
    url = postgres.new_database(migrated=True)
    app = create_app(url)
    http = TestClient(app, headers=headers_for(app))
    nodes = {name: http.post("/v1/nodes", json={"name": name, "tunnel_ip": f"198.18.7.{i}",
                                                  "management_ip": f"198.18.8.{i}"}).json()["id"]
             for i, name in enumerate(TOR_PORTS, 1)}
    sw = http.post("/v1/fabric/switches", json={"name": "tor1", "management_ip": "198.18.8.9"}).json()["id"]
    tor = datapath_id_fabric(sw)
    phy = {name: datapath_id_phy(node) for name, node in nodes.items()}
    datapaths = {dpid: Datapath(dpid) for dpid in (*phy.values(), tor)}

    # each replica's process asks for the key on its own engine: the first makes it, the other reads it
    key_a, key_b = (leases.shared_key(open_store(url), "lldp") for _ in range(2))
    assert key_a == key_b and len(key_a) == 32
    assert leases.shared_key(open_store(url), "another") != key_a

    a = replica(url, key_a, {phy["c1"]}, datapaths, nodes, sw)            # masters c1's br-phy
    b = replica(url, key_b, {phy["c2"], tor}, datapaths, nodes, sw)       # masters c2's br-phy and the ToR
    assert a.send_lldp() == 1 and b.send_lldp() == 1
    # a slave's packet-out would be refused by the switch: each br-phy is sent its master's probe only
    assert [len(datapaths[phy[n]].sent) for n in ("c1", "c2")] == [1, 1] and datapaths[tor].sent == []

    for name in ("c1", "c2"):     # the ToR punts each probe to its master, b, on the port facing the node
        out = datapaths[phy[name]].sent[0]
        assert lldp_parse(out.data, key_b) == (phy[name], UL0)
        b.on_packet_in(SimpleNamespace(data=out.data, datapath=SimpleNamespace(id=tor),
                                       match={"in_port": TOR_PORTS[name]}))
    b._links.submit(lambda: None).result(10)
    links = http.get(f"/v1/fabric/switches/{sw}").json()["links"]
    assert {(x["port_name"], x["node"]) for x in links if x["source"] == "lldp"} == {("c1", "c1"), ("c2", "c2")}

    # a process with a key of its own (not the cluster's) cannot sign for it
    outsider = FabricRuntime(SimpleNamespace(datapath=datapaths.get), session_factory(open_store(url)), 6653,
                             lambda: None)
    outsider.phy_ports = {nodes["c1"]: UL0}
    outsider.send_lldp()
    assert lldp_parse(datapaths[phy["c1"]].sent[-1].data, key_a) is None
    for rt in (a, b, outsider):
        rt.stop()
    app.state.engine.dispose()
