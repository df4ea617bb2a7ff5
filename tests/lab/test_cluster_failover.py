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
and no write is answered a 5xx other than a clean 503."""
from __future__ import annotations

import time

import pytest

from fathom.auth.client import read_token_file
from fathom.bench import ha
from fathom.model import datapath_id
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
LEASE = 1.0            # fathom.cluster.leases.Timing's defaults: a lease, and a round every 0.25 s
ROUND = 0.25
PAUSE = 3 * LEASE


def test_replicas_killed_paused_and_restarted_in_turn_lose_no_echo_and_no_write():
    pg = PostgresServer().start()
    try:
        with running_lab("ha1", TOPOLOGY, standalone=False, db=pg.new_database(), replicas=2) as lab:
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
            pingers = [ha.Pinger(lab, "vm1", "198.19.42.12"), ha.Pinger(lab, "vm2", "198.19.42.11")]
            writers = ha.Writers([r["url"] for r in cluster.replicas], cluster.token, network, 2,
                                 "198.19.42.200").start()
            timeline = []
            try:
                time.sleep(1)
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
    finally:
        pg.stop()
