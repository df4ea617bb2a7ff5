"""LLDP link discovery under two controller replicas (`fathom controller --cluster` on one PostgreSQL):
the lab of bench l3 (three nodes behind a fabric switch whose wiring nobody declared), its seven
switches shared out between the replicas. Each br-phy's master sends its probes; the fabric switch's
master receives them and verifies them with the key the replicas share, so every node's link is
learnt whichever replica masters its br-phy."""
from __future__ import annotations

from pathlib import Path

import pytest

import fathom.bench
from fathom.lab.ovs import wait_for
from fathom.model import datapath_id_fabric, datapath_id_phy
from tests.unit.pgserver import PostgresServer

from .util import lab_api as api, running_lab

pytestmark = pytest.mark.lab

TOPOLOGY = (Path(fathom.bench.__file__).parent / "topologies" / "l3.yaml").read_text()
NODES = {"c1", "c2", "gw"}


def test_lldp_finds_every_node_whichever_replica_masters_its_br_phy():
    pg = PostgresServer().start()
    try:
        with running_lab("cfab", TOPOLOGY, standalone=False, db=pg.new_database(), replicas=2) as lab:
            c = api(lab)

            def learnt() -> set:
                links = c.get("/fabric/switches/1").json()["links"]
                return {(x["node"], x["port_name"]) for x in links if x["source"] == "lldp"}
            wait_for(lambda: learnt() == {(n, n) for n in NODES}, 60, "an LLDP link to every node")
            nodes = {n["name"]: n["id"] for n in c.get("/nodes").json()}
            holders = {x["switch"]: x["holder"] for x in c.get("/cluster").json()["leases"]}
            tor = holders[f"{datapath_id_fabric(1):016x}"]
            phy = {n: holders[f"{datapath_id_phy(nodes[n]):016x}"] for n in NODES}
            assert tor is not None and None not in phy.values(), (tor, phy)
            # a lease between two holders (freed by one for the other's next round) has none for a moment
            assert {lease["holder"] for lease in c.get("/cluster").json()["leases"]} - {None} == \
                {r["id"] for r in c.get("/cluster").json()["replicas"]}, "both replicas master switches"
    finally:
        pg.stop()
