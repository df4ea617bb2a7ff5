"""Restarts under traffic, on real OVS: the controller (however long it is gone, not one packet may
be lost on br-int, br-phy or the fabric switch) and a node's ovs-vswitchd (the lab's supervisor restarts it;
meanwhile the controller marks that node's objects, and only those, error)."""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import fathom.lab
from fathom.lab.ovs import wait_for

from .util import BackgroundPing, ping, running_lab, sh, lab_api as api

TOPOLOGY = (Path(fathom.lab.__file__).parent / "topologies" / "tenants.yaml").read_text()
IP = {"vm1": "198.19.1.11", "vm3": "198.19.1.13", "grn1": "198.19.2.21", "grn2": "198.19.2.22"}
# every bridge fathom programs: br-int and br-phy of each node, the fabric switch
BRIDGES = [(n, b) for n in ("compute1", "compute2", "gw") for b in ("br-int", "br-phy")] + [("fabric", "br-fabric")]
INTERVAL = 0.02
# longer than OVS's longest reconnect backoff (8 s) and than its fail-open trigger, 3 inactivity
# probes (15 s): the outage in which a standalone br-phy flushed its flows
OUTAGE = 20
# how long the pings go on after the restarted controller's full pass (then they are stopped)
AFTER_REPLAY = 3


@pytest.fixture(scope="module")
def lab():
    with running_lab("rs1", TOPOLOGY, standalone=False) as lab:
        yield lab


def _flows(lab, node: str, bridge: str) -> dict[str, float]:
    """Flow (without counters) -> its age in seconds."""
    out = sh(lab, node, "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", bridge).stdout
    flows = {}
    for line in out.splitlines():
        m = re.search(r"duration=([\d.]+)s", line)
        if m:
            key = re.sub(r"(duration|n_packets|n_bytes|idle_age|hard_age|importance)=[^,]*, ?", "", line).strip()
            flows[key] = float(m.group(1))
    return flows


def _controllers(lab, node: str) -> list[dict]:
    """The node's OVSDB Controller rows (one per bridge): is_connected and status."""
    out = sh(lab, node, "ovs-vsctl", "--format=json", "--columns=target,is_connected,status,max_backoff", "list",
             "controller").stdout
    rows = []
    for target, connected, status, backoff in json.loads(out)["data"]:
        rows.append({"target": target, "is_connected": connected, "status": dict(status[1]), "max_backoff": backoff})
    return rows


def _supervised(lab, node: str, daemon: str) -> dict:
    entry = next(n for n in lab.status()["nodes"] if n["name"] == node)
    return entry["supervisor"]["daemons"][daemon]


def test_controller_outage_longer_than_the_backoff_loses_no_packet(lab):
    c = api(lab)
    before = {b: _flows(lab, *b) for b in BRIDGES}
    assert all(before.values())
    stamp = time.monotonic()
    # VXLAN and VLAN, both across nodes (so through br-int, br-phy and the fabric switch); a count long enough
    # to cover the outage, OVS's reconnect and a full pass: they are stopped AFTER_REPLAY s after it
    pingers = [BackgroundPing(lab, "vm1", IP["vm3"], OUTAGE + 25, INTERVAL),
               BackgroundPing(lab, "grn1", IP["grn2"], OUTAGE + 25, INTERVAL)]
    time.sleep(2)
    killed = time.time()
    os.kill(lab.state()["controller"]["pid"], signal.SIGKILL)
    time.sleep(OUTAGE)
    # the switches have been on their own past OVS's backoff and probes
    rows = _controllers(lab, "compute1")
    assert len(rows) == 2 and not any(r["is_connected"] for r in rows), rows
    assert all(int(r["status"].get("sec_since_disconnect", 0)) >= OUTAGE - 6 for r in rows), rows
    # and retry it every second (the controller's Controller rows), so they are back within one
    assert all(r["max_backoff"] == 1000 for r in rows), rows
    lab.restart_controller()
    wait_for(lambda: len(c.get("/health").json()["switches"]) == len(BRIDGES), 20,
             "every switch back on the controller")
    c.post("/sync").raise_for_status()       # one full pass after reconnecting
    replayed = time.time()
    time.sleep(AFTER_REPLAY)
    assert all(p.running() for p in pingers), "the pings ended before the switches were back: not a proof"
    for p in pingers:
        sent, replies = p.stop()
        answered = [q for q, _ in replies]
        # every request answered, in order, but the last one if it was still in flight when stopped
        assert answered == list(range(1, len(answered) + 1)) and len(answered) >= sent - 1, \
            f"ping {p.what}: {sent - len(answered)} of {sent} lost (first unanswered: " \
            f"{next((q for q in range(1, sent + 1) if q not in set(answered)), None)})"
        assert replies[0][1] < killed and replies[-1][1] > replayed, \
            f"ping {p.what}: the replies do not span the outage"
    elapsed = time.monotonic() - stamp
    for bridge, flows in before.items():
        after = _flows(lab, *bridge)
        assert after.keys() == flows.keys(), f"{bridge}: flows differ after the restart"
        churned = [f for f, age in after.items() if age < elapsed]
        assert churned == [], f"{bridge}: rewritten by the restarted controller: {churned}"


def test_killed_vswitchd_is_restarted_and_traffic_returns_within_5s(lab):
    ovs = lab.ovs("compute2")
    restarts = _supervised(lab, "compute2", "ovs-vswitchd")["restarts"]
    pinger = BackgroundPing(lab, "vm1", IP["vm3"], 12, INTERVAL)
    time.sleep(2)
    killed = time.time()
    os.kill(ovs.pid("ovs-vswitchd"), signal.SIGKILL)
    wait_for(lambda: _supervised(lab, "compute2", "ovs-vswitchd")["restarts"] == restarts + 1, 5,
             "the supervisor to restart ovs-vswitchd")
    sent, received, replies = pinger.result()
    before = [t for t in replies if t < killed]
    after = [t for t in replies if t > killed]
    assert before and after, (sent, received)
    assert after[0] - killed < 5, f"traffic back {after[0] - killed:.1f} s after the kill"
    # and back for good: no gap after that
    assert max(b - a for a, b in zip(after, after[1:])) < 1, "traffic stopped again"
    entry = next(n for n in lab.status()["nodes"] if n["name"] == "compute2")
    assert entry["ovs_vswitchd"] and entry["supervisor"]["daemons"]["ovs-vswitchd"]["last_exit"] == "killed by SIGKILL"
    c = api(lab)
    wait_for(lambda: all(o["status"] == "active" for kind in ("nodes", "ports") for o in c.get(f"/{kind}").json()),
             10, "every node and port active again")


def test_stopped_vswitchd_makes_its_node_and_ports_error_not_the_others(lab):
    """A clean stop stays stopped (Restart=on-failure), which holds the outage open to look at."""
    c = api(lab)
    ovs = lab.ovs("compute2")
    subprocess.run(["kill", "-TERM", str(ovs.pid("ovs-vswitchd"))], check=True)
    try:
        wait_for(lambda: not ovs.alive("ovs-vswitchd"), 5, "ovs-vswitchd to stop")

        def by_name(kind):
            return {o["name"]: o for o in c.get(f"/{kind}").json()}
        def lost(obj):
            return obj["status"] == "error" and "ovs-vswitchd down or unreachable" in obj["status_reason"]
        wait_for(lambda: lost(by_name("nodes")["compute2"]), 10, "compute2 in error")
        wait_for(lambda: lost(by_name("ports")["vm3"]), 10, "vm3 in error")
        ports = by_name("ports")
        for name in ("vm3", "red3", "grn2"):          # compute2's own ports
            assert ports[name]["status"] == "error", ports[name]
            assert "node compute2" in ports[name]["status_reason"], ports[name]
        for name in ("vm1", "vm2", "red1", "grn1"):   # the others' keep working, and say so
            assert ports[name]["status"] == "active", ports[name]
        nodes = by_name("nodes")
        assert nodes["compute1"]["status"] == nodes["gw"]["status"] == "active"
        for kind in ("networks", "subnets", "routers"):
            assert all(o["status"] == "active" for o in c.get(f"/{kind}").json()), kind
        assert ping(lab, "vm1", "198.19.1.12").returncode == 0   # compute1 is fine
        sup = _supervised(lab, "compute2", "ovs-vswitchd")
        assert sup["state"] == "stopped" and sup["last_exit"] == "killed by SIGTERM", sup
    finally:
        ovs.start_vswitchd()
    wait_for(lambda: all(o["status"] == "active" for kind in ("nodes", "ports") for o in c.get(f"/{kind}").json()),
             10, "every node and port active again")
    assert ping(lab, "vm1", IP["vm3"]).returncode == 0
    assert ping(lab, "grn1", IP["grn2"]).returncode == 0


def test_killed_ovsdb_server_is_restarted(lab):
    ovs = lab.ovs("compute1")
    restarts = _supervised(lab, "compute1", "ovsdb-server")["restarts"]
    os.kill(ovs.pid("ovsdb-server"), signal.SIGKILL)
    wait_for(lambda: _supervised(lab, "compute1", "ovsdb-server")["restarts"] == restarts + 1, 5,
             "the supervisor to restart ovsdb-server")
    wait_for(lambda: ovs.alive("ovsdb-server"), 5, "ovsdb-server back")
    wait_for(lambda: ping(lab, "vm1", IP["vm3"]).returncode == 0, 10, "traffic through compute1")
    c = api(lab)
    wait_for(lambda: all(o["status"] == "active" for kind in ("nodes", "ports") for o in c.get(f"/{kind}").json()),
             15, "every node and port active again")


def test_lab_status_shows_the_restarts(lab):
    fathom = os.path.join(os.path.dirname(os.sys.executable), "fathom")
    st = json.loads(subprocess.run([fathom, "lab", "status", "-n", "rs1", "--json"], capture_output=True, text=True,
                                   check=True).stdout)
    nodes = {n["name"]: n for n in st["nodes"]}
    assert all(n["supervisor"]["running"] for n in nodes.values())
    assert nodes["compute2"]["supervisor"]["daemons"]["ovs-vswitchd"]["restarts"] >= 1   # the SIGKILL above
    assert nodes["gw"]["supervisor"]["daemons"]["ovs-vswitchd"]["restarts"] == 0
    table = subprocess.run([fathom, "lab", "status", "-n", "rs1"], capture_output=True, text=True, check=True).stdout
    row = next(line for line in table.splitlines() if "compute2" in line)
    assert re.search(r"yes \(\d+ restarts?\)", row), table
