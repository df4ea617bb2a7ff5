"""Two controller replicas (`fathom controller --cluster`) on one PostgreSQL, a lab of two compute
nodes whose agents poll the lab's first replica: the other replica, which hears none of them, shows
every agent up (the replicas tell each other with their lease rounds), longer after the agents'
last report than an agent counts as up, and answers a trace of actual tables by asking the
first replica's trace desk, hop for hop."""
from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from fathom.auth.client import read_token_file
from fathom.client import Client
from fathom.lab.ovs import wait_for
from fathom.store.agents import STALE_AFTER
from tests.unit.pgserver import PostgresServer

from .util import running_lab

pytestmark = pytest.mark.lab

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 3043, cidr: 198.19.43.0/24}
nodes:
  - name: compute1
    vms: [{name: vm1, mac: "02:fa:00:00:43:01", ip: 198.19.43.11/24, network: blue}]
  - name: compute2
    vms: [{name: vm2, mac: "02:fa:00:00:43:02", ip: 198.19.43.12/24, network: blue}]
"""


def test_the_replica_no_agent_polls_sees_every_agent_and_traces_their_tables():
    pg = PostgresServer().start()
    try:
        db = pg.new_database()
        with running_lab("hm1", TOPOLOGY, standalone=False, db=db, replicas=2) as lab:
            state = lab.state()
            token = read_token_file(state["controller"]["token_file"])
            other = next(r["url"] for r in state["controller"]["replicas"] if r["url"] != state["controller"]["url"])
            api = Client(other, token=token, timeout=30)
            ports = {p["name"]: p["id"] for p in api.list("/ports")}
            for port in ports.values():
                assert api.wait_status("ports", port, "active", timeout=60)["status"] == "active"
            wait_for(lambda: sum(r["live"] for r in api.get("/cluster")["replicas"]) == 2, 20, "both replicas live")
            # past the time an agent counts as up after its last report (the store's): up only by
            # being heard, by the first replica
            store = create_engine(db)

            def since_report() -> float:
                with store.connect() as conn:
                    return conn.execute(text("SELECT extract(epoch FROM now() - max(reported_at))::float "
                                             "FROM node_agents")).scalar_one()
            time.sleep(max(0.0, STALE_AFTER + 1 - since_report()))
            assert since_report() > STALE_AFTER
            store.dispose()
            agents = {a["node"]: a["state"] for a in api.get("/agents")}
            assert agents == {"compute1": "up", "compute2": "up"}, agents
            t = api.post("/traces", json={"port_id": ports["vm1"], "to_port_id": ports["vm2"], "actual": True})
            assert [(h["switch"], h["tables"]) for h in t["hops"]] == [("br-int compute1", "actual"),
                                                                       ("br-int compute2", "actual")], t["hops"]
            assert t["verdict"]["result"] == "delivered" and t["verdict"]["port"] == "vm2", t["verdict"]
            api.close()
    finally:
        pg.stop()
