"""Two controller replicas (`fathom controller --cluster`) on one PostgreSQL, a lab of two compute
nodes whose switches connect to both: the master of a node's br-int is killed (SIGKILL) while a VM
on each node pings the other; the other replica takes its lease, becomes the switch's master, and a
port created through it turns active and forwards. The pings lose no echo: the data plane never
waits for a controller."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from fathom.auth.client import read_token_file
from fathom.client import Client
from fathom.host import exec as host_exec
from fathom.lab.ovs import wait_for
from fathom.model import datapath_id
from tests.unit.pgserver import PostgresServer

from .util import ping, running_lab

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


def pinger(lab, vm: str, ip: str) -> subprocess.Popen:
    return subprocess.Popen(host_exec.argv(["ping", "-i", "0.02", "-W", "1", ip], lab.ns(vm)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def lost_echoes(proc: subprocess.Popen) -> tuple[int, list[int]]:
    """Stop a pinger: (echoes sent, sequence numbers never answered, the last one aside: it may
    still have been on its way when the pinger stopped)."""
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=10)
    sent = int(re.search(r"(\d+) packets transmitted", out).group(1))
    answered = {int(s) for s in re.findall(r"icmp_seq=(\d+) ttl=", out)}
    return sent, [s for s in range(1, sent) if s not in answered]


def masters(api: Client, switches: dict[str, str]) -> dict[str, str | None]:
    """node -> the replica (API address) holding its br-int's lease."""
    cluster = api.get("/cluster")
    address = {r["id"]: r["address"] for r in cluster["replicas"] if r["live"]}
    holder = {x["switch"]: x["holder"] for x in cluster["leases"]}
    return {node: address.get(holder.get(switch)) for node, switch in switches.items()}


def test_a_killed_master_s_switches_move_to_the_other_replica_and_no_echo_is_lost():
    pg = PostgresServer().start()
    try:
        with running_lab("qb1", TOPOLOGY, standalone=False, db=pg.new_database(), replicas=2) as lab:
            state = lab.state()
            token = read_token_file(state["controller"]["token_file"])
            replicas = {r["url"]: r for r in state["controller"]["replicas"]}
            apis = {url: Client(url, token=token, timeout=10) for url in replicas}
            first = apis[state["controller"]["url"]]
            switches = {n["name"]: f"{datapath_id(n['id']):016x}" for n in first.list("/nodes")}
            # both replicas live, every br-int mastered (the lab's fabric switch and br-phy too: shares of 5)
            wait_for(lambda: all(masters(first, switches).values())
                     and sum(r["live"] for r in first.get("/cluster")["replicas"]) == 2, 20, "every br-int mastered")
            pingers = [pinger(lab, "vm1", "198.19.42.12"), pinger(lab, "vm2", "198.19.42.11")]
            try:
                time.sleep(1)
                # kill the master of a node's br-int, the one the agents do not talk to (the lab's
                # first) if it masters one
                held = masters(first, switches)
                node, victim = next(((n, url) for n, url in held.items() if url != state["controller"]["url"]),
                                    next(iter(held.items())))
                survivor = next(url for url in replicas if url != victim)
                apis.pop(victim).close()
                first = apis[survivor]
                killed = time.monotonic()
                os.kill(replicas[victim]["pid"], signal.SIGKILL)
                wait_for(lambda: masters(first, switches)[node] == survivor, 3 * LEASE,
                         f"the survivor to take {node}'s br-int")
                taken = time.monotonic() - killed
                print(f"{node}'s br-int taken {taken:.2f} s after the kill")
                assert taken <= LEASE + ROUND + 1.0, f"the lease moved {taken:.2f} s after the kill"
                # a port through the survivor, on the node it took over: active, and it forwards
                network = next(n["id"] for n in first.list("/networks") if n["name"] == "blue")
                lab.add_vm(node, "vm3", "02:fa:00:00:42:03", "198.19.42.13/24", None)
                port = first.post("/ports", json={"network_id": network, "name": "vm3", "mac_address": "02:fa:00:00:42:03",
                                                  "fixed_ips": [{"ip_address": "198.19.42.13"}], "node": node,
                                                  "interface_name": "vm3"})
                lab.plug_vm(node, "vm3", "02:fa:00:00:42:03", "blue")
                assert first.wait_status("ports", port["id"], "active", timeout=20)["status"] == "active"
                other = "198.19.42.12" if node == "compute1" else "198.19.42.11"
                assert ping(lab, "vm3", other).returncode == 0
            finally:
                results = [lost_echoes(p) for p in pingers]
            for sent, lost in results:
                assert sent > 100 and lost == [], f"{len(lost)} of {sent} echoes lost: {lost[:20]}"
            for api in apis.values():
                api.close()
    finally:
        pg.stop()
