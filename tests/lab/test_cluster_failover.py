"""Two controller replicas (`fathom controller --cluster`) on one PostgreSQL, a lab of two compute
nodes whose switches connect to both, while a VM on each node pings the other (every 20 ms) and two
API writers create and delete ports throughout. In turn, with fathom.bench.ha's own events (the
short form of `fathom bench ha`):

1. the master of a node's br-int is paused (SIGSTOP) for a few lease times: its lease moves, a port
   created meanwhile has its flows on the switch through the new master; woken (SIGCONT), the
   paused replica writes nothing (the br-int holds what its master wants);
2. both replicas are restarted in turn (a rolling restart): a port created during it has its flows
   on the switch;
3. the master of the node's br-int is killed (SIGKILL): the other replica takes its lease, becomes
   the switch's master, and a port created at once has its flows on the switch.

No echo is lost (the data plane never waits for a controller), no write answered 2xx is missing,
and no write is answered a 5xx other than a clean 503.

Before those events, on the same lab (its nodes' agents poll the lab's first replica): the other
replica, which hears none of them, shows every agent up (the replicas tell each other with their
lease rounds), longer after the agents' last report than an agent counts as up, and answers a trace
of actual tables by asking the first replica's trace desk, hop for hop."""
from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from fathom.auth.client import read_token_file
from fathom.bench import ha
from fathom.client import Client
from fathom.cluster.leases import Timing
from fathom.lab.ovs import wait_for
from fathom.model import datapath_id
from fathom.store.agents import STALE_AFTER
from tests.unit.pgserver import PostgresServer

from .util import running_lab

pytestmark = pytest.mark.lab

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 3042, cidr: 198.19.42.0/24}
nodes:
  - name: compute1
    vms: [{name: vm1, mac: "02:fa:00:00:42:01", ip: 198.19.42.11/24, network: blue}]
  - name: compute2
    vms: [{name: vm2, mac: "02:fa:00:00:42:02", ip: 198.19.42.12/24, network: blue}]
"""
LEASE, ROUND = Timing().lease, Timing().renew    # the replicas' (defaults): a lease, a round's interval
PAUSE = 3 * LEASE


@pytest.fixture(scope="module")
def cluster_lab():
    """The lab and its store's URL, for both tests (in this order: the views before the events)."""
    pg = PostgresServer().start()
    try:
        db = pg.new_database()
        with running_lab("ha1", TOPOLOGY, standalone=False, db=db, replicas=2) as lab:
            yield lab, db
    finally:
        pg.stop()


def test_the_replica_no_agent_polls_sees_every_agent_and_traces_their_tables(cluster_lab):
    lab, db = cluster_lab
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
    project = api.get(f"/ports/{ports['vm1']}")["project_id"]
    member = Client(other, token=api.post("/tokens", json={"project_id": project, "roles": ["member"]})["token"],
                    timeout=30)
    for caller in (api, member):      # a member's trace crosses replicas as an admin's does
        t = caller.post("/traces", json={"port_id": ports["vm1"], "to_port_id": ports["vm2"], "actual": True})
        assert [(h["switch"], h["tables"]) for h in t["hops"]] == [("br-int compute1", "actual"),
                                                                   ("br-int compute2", "actual")], t["hops"]
        assert t["verdict"]["result"] == "delivered" and t["verdict"]["port"] == "vm2", t["verdict"]
    # a live trace: both nodes' watchers armed, the probe injected and seen, through that replica
    lv = member.post("/traces", json={"port_id": ports["vm1"], "to_port_id": ports["vm2"], "live": True})
    assert lv["verdict"]["result"] == "delivered" and lv["live"]["unknown"] == {}, (lv["verdict"], lv["live"]["unknown"])
    assert lv["live"]["injected"] and {p["node"] for p in lv["live"]["points"]} >= {"compute1", "compute2"}, lv["live"]
    member.close()
    api.close()


def test_replicas_killed_paused_and_restarted_in_turn_lose_no_echo_and_no_write(cluster_lab):
    lab, _ = cluster_lab
    state = lab.state()
    cluster = ha.Cluster(lab, read_token_file(state["controller"]["token_file"]))
    api = cluster.api
    cluster.wait_settled(20)
    network = next(n["id"] for n in api.list("/networks") if n["name"] == "blue")
    switches = {n["name"]: f"{datapath_id(n['id']):016x}" for n in api.list("/nodes")}
    # the node whose br-int the lab's second replica masters (the first's agents' replica
    # aside), if it masters one
    held = cluster.holders()
    node = next((n for n, s in switches.items() if held[s] != state["controller"]["url"]), "compute1")
    switch = switches[node]
    probe = ha.Probe(lab, api, "blue", network, node, "198.19.42.160")
    probe.stock(5)      # one for each event, the first and the last port, plugged before the pings start
    pingers = [ha.Pinger(lab, "vm1", "198.19.42.12"), ha.Pinger(lab, "vm2", "198.19.42.11")]
    writers = ha.Writers([r["url"] for r in cluster.replicas], cluster.token, network, 2,
                         "198.19.42.200").start()
    timeline = []
    try:
        time.sleep(1)
        # a port made through the replica that is not its switch's master: the master reads the
        # write from the change feed and programs it
        cluster.ask_first(cluster.other_than(cluster.master_of(switch)))
        vif = probe.plug()
        port = probe.create(vif)
        assert probe.applied(vif, 10), "a port made through the replica that does not master its switch"
        probe.remove(port, vif)
        started = time.monotonic()
        timeline.append(ha.pause_master(cluster, probe, node, switch, PAUSE))
        print(f"pause: {timeline[-1]} ({time.monotonic() - started:.1f} s)")
        started = time.monotonic()
        timeline.append(ha.rolling_restart(cluster, probe))
        print(f"rolling restart: {timeline[-1]} ({time.monotonic() - started:.1f} s)")
        started = time.monotonic()
        timeline.append(ha.kill_master(cluster, probe, switch, start_again=False))
        print(f"kill: {timeline[-1]} ({time.monotonic() - started:.1f} s)")
        # after all of it, the cluster still makes ports
        vif = probe.plug()
        assert probe.active(probe.create(vif)) and probe.applied(vif)
    finally:
        writes = writers.stop()
        results = [p.stop() for p in pingers]
        probe.unplug()
    pause, rolling, kill = timeline
    assert kill["lease_s"] is not None and kill["lease_s"] <= LEASE + ROUND + 1.0, kill
    assert kill["applied_s"] is not None, kill
    assert pause["lease_s"] is not None and pause["lease_s"] < PAUSE, pause
    assert pause["applied_s"] is not None and pause["applied_s"] < PAUSE, \
        f"the new master did not apply a change while the old one was paused: {pause}"
    # woken, the old master changed nothing on the switch: it holds what its master wants
    # (what the switches answered the woken one, refusals and role statuses, is printed)
    assert pause["in_sync"], pause
    assert rolling["applied_s"] is not None, rolling
    for sent, lost in results:
        assert sent > 100 and lost == [], f"{len(lost)} of {sent} echoes lost: {lost[:20]}"
    assert writes.created and not writers.missing(api), writers.missing(api)
    assert not {k for k in writes.answers if k.startswith("5") and k != "503"}, writes.answers
    assert writes.given_up == 0, writes.answers
    writers.close()
    cluster.close()
