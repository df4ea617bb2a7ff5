"""A switch that does not answer holds no other switch's changes, on real OVS: compute2's
ovs-vswitchd paused (SIGSTOP: its OpenFlow connection stays open, nothing is answered) while the
controller awaits its bundle's commit, reads it back (an explicit sync), counts its flows (the
periodic check) or asks the barrier before a status turns `active`. Each time compute2 is `not
answering` (its node and ports `pending`, saying what it did not answer) within REPLY_WAIT and a
bit, a port on compute1 turns `active` meanwhile, and once resumed compute2 is read back, brought
to its desired state, and its ports turn `active` again. Two nodes paused at once (compute2 and gw:
each one's br-int and br-phy silent) hold a sync and the check one REPLY_WAIT, not one per
switch. Every request on its own: tests/lab/test_unanswered_requests.py."""
import contextlib
import datetime
import os
import re
import signal
import threading
import time

import pytest

from fathom.client import Client
from fathom.controller.switch import REPLY_WAIT
from fathom.host.exec import run
from fathom.lab.ovs import wait_for

from .util import controller_log, ping, running_lab, unplugged_vm

# How long something may take while compute2 is paused: a pass waits REPLY_WAIT for compute2, then
# goes on. A pass that waited for compute2's reply would hold it as long as the pause lasts (here:
# until this wait ran out); the 10 s leave a busy two-core machine room. Not a speed target: what it
# tells apart is held or not held.
HELD = REPLY_WAIT + 10
CHECK_INTERVAL = 10     # the lab controller's --interval (fathom.lab.controller)
# The controller's wait between a change's commit and the barrier before its objects turn `active`
# (`fathom controller --datapath-settle`, at most 1 s): long enough to pause a switch in between.
SETTLE = 1.0


@pytest.fixture(scope="module")
def lab():
    with running_lab("wt1", standalone=False, controller_options=("--datapath-settle", str(SETTLE))) as lab:
        yield lab


def make_vm(lab, name: str, node: str, mac: str, ip: str) -> None:
    """A VM whose veth's other end, `name`, is a port of `node`'s br-int with iface-id `name`."""
    unplugged_vm(lab, name, node, mac, ip)
    lab.ovs(node).vsctl("add-port", "br-int", name, "--", "set", "interface", name, f"external_ids:iface-id={name}")


def new_port(api, lab, name: str, mac: str, ip: str, node: str = "compute1") -> dict:
    """A port on `node` (its VM plugged), as the API answers its creation."""
    make_vm(lab, name, node, mac, ip)
    net = api.find("networks", "blue")
    return api.post("/ports", json={"network_id": net["id"], "name": name, "node": node, "interface_name": name,
                                    "mac_address": mac, "fixed_ips": [{"ip_address": ip}]})


@contextlib.contextmanager
def paused(lab, *nodes: str):
    vswitchds = [lab.ovs(node).pid("ovs-vswitchd") for node in nodes]
    for vswitchd in vswitchds:
        os.kill(vswitchd, signal.SIGSTOP)
    try:
        yield
    finally:
        for vswitchd in vswitchds:
            os.kill(vswitchd, signal.SIGCONT)


def pending_for(api, lab, what: str) -> None:
    """compute2 and vm3 on it are `pending`: not answering `what`."""
    node = api.find("nodes", "compute2")
    assert node["status"] == "pending" and f"not answering: no reply to {what}" in node["status_reason"], \
        (node, controller_log(lab))
    vm3 = api.get(f"/ports/{api.find('ports', 'vm3')['id']}")
    assert vm3["status"] == "pending" and "not answering" in vm3["status_reason"], vm3
    assert api.get(f"/ports/{api.find('ports', 'vm1')['id']}")["status"] == "active"


def caught_up(api, lab) -> None:
    """compute2, resumed, answered what it held: read back, its ports `active`, nothing left to repair."""
    got = api.wait_status("ports", api.find("ports", "vm3")["id"], timeout=30)
    assert got["status"] == "active", (got, controller_log(lab))
    assert api.find("nodes", "compute2")["status"] == "active"
    drift = api.health()["drift"].get("audit", 0)
    api.sync()                     # reads every switch back: compute2 holds what it should
    assert api.health()["drift"].get("audit", 0) == drift, controller_log(lab)


def test_a_switch_paused_before_its_commit_holds_no_other_switchs_changes(lab):
    api = Client.for_lab(lab.state())
    ports = {p["name"]: p for p in api.list("/ports")}
    for name in ("vm1", "vm3"):
        assert api.wait_status("ports", ports[name]["id"], timeout=30)["status"] == "active"
    group = ports["vm3"]["security_groups"][0]
    assert group in ports["vm1"]["security_groups"]
    with paused(lab, "compute2"):
        # a change on both nodes, then one on compute1 alone
        api.post("/security-group-rules", json={"security_group_id": group, "direction": "ingress",
                                                "protocol": "tcp", "port_range_min": 5001, "port_range_max": 5001})
        port = new_port(api, lab, "wtx", "02:fa:00:00:01:60", "198.19.1.60")
        got = api.wait_status("ports", port["id"], timeout=HELD)
        assert got["status"] == "active", (got, controller_log(lab))
        assert ping(lab, "wtx", "198.19.1.11").returncode == 0          # vm1, on compute1
        pending_for(api, lab, "its bundle's commit")      # compute2 has not confirmed
    caught_up(api, lab)
    wait_for(lambda: ping(lab, "wtx", "198.19.1.13").returncode == 0, 10, "wtx to reach vm3 on compute2")
    run(["ip", "netns", "del", lab.ns("wtx")])


def test_a_switch_paused_while_read_back_holds_no_other_switchs_changes(lab):
    api = Client.for_lab(lab.state())
    synced = []
    with paused(lab, "compute2"):
        # an explicit sync reads every switch back (as on a switch's connection and in the audit)
        sync = threading.Thread(target=lambda: synced.append(Client.for_lab(lab.state()).sync()), daemon=True)
        sync.start()
        api.wait_until(f"/nodes/{api.find('nodes', 'compute2')['id']}", lambda n: n["status"] == "pending", HELD)
        pending_for(api, lab, "a group read")
        sync.join(HELD)
        assert synced, controller_log(lab)
        port = new_port(api, lab, "wty", "02:fa:00:00:01:61", "198.19.1.61")
        got = api.wait_status("ports", port["id"], timeout=HELD)
        assert got["status"] == "active", (got, controller_log(lab))
        pending_for(api, lab, "a group read")              # left alone since
    caught_up(api, lab)
    run(["ip", "netns", "del", lab.ns("wty")])


def test_a_switch_paused_at_rest_is_found_by_the_check(lab):
    api = Client.for_lab(lab.state())
    node = api.find("nodes", "compute2")
    with paused(lab, "compute2"):
        # the periodic check counts every switch's flows: compute2's count goes unanswered
        api.wait_until(f"/nodes/{node['id']}", lambda n: n["status"] == "pending", CHECK_INTERVAL + HELD)
        pending_for(api, lab, "a flow count")
        port = new_port(api, lab, "wtz", "02:fa:00:00:01:62", "198.19.1.62")
        got = api.wait_status("ports", port["id"], timeout=HELD)
        assert got["status"] == "active", (got, controller_log(lab))
    caught_up(api, lab)
    run(["ip", "netns", "del", lab.ns("wtz")])


def test_a_switch_paused_before_the_status_writes_barrier_holds_no_other_switchs_changes(lab):
    """compute2 takes a new port's flows (it answers the commit) and is paused before the barrier
    that precedes the port's `active`, SETTLE later."""
    api = Client.for_lab(lab.state())
    name, mac, ip = "wtw", "02:fa:00:00:01:63", "198.19.1.63"
    unplugged_vm(lab, name, "compute2", mac, ip)
    net = api.find("networks", "blue")
    port = api.post("/ports", json={"network_id": net["id"], "name": name, "node": "compute2", "interface_name": name,
                                    "mac_address": mac, "fixed_ips": [{"ip_address": ip}]})
    assert api.wait_status("ports", port["id"], want="down", timeout=HELD)["status"] == "down"
    ovs = lab.ovs("compute2")
    ovs.vsctl("add-port", "br-int", name, "--", "set", "interface", name, f"external_ids:iface-id={name}")
    # the VIF plugged: a pass sends compute2 the port's flows (those matching its OpenFlow port) and
    # turns it `active` once compute2 answered the barrier after them
    in_port = re.compile(rf"in_port={int(ovs.vsctl('get', 'interface', name, 'ofport'))}\b")
    deadline = time.monotonic() + HELD
    while not in_port.search(ovs.ofctl("dump-flows", "br-int")):     # its commit is answered
        assert time.monotonic() < deadline, controller_log(lab)
    time.sleep(SETTLE / 5)          # its commit reply on its way, its barrier SETTLE after
    with paused(lab, "compute2"):
        api.wait_until(f"/nodes/{api.find('nodes', 'compute2')['id']}", lambda n: n["status"] == "pending", HELD)
        pending_for(api, lab, "a barrier")
        got = api.get(f"/ports/{port['id']}")
        assert got["status"] == "pending" and "not answering" in got["status_reason"], got
        other = new_port(api, lab, "wtv", "02:fa:00:00:01:64", "198.19.1.64")
        got = api.wait_status("ports", other["id"], timeout=HELD)
        assert got["status"] == "active", (got, controller_log(lab))
    caught_up(api, lab)
    assert api.wait_status("ports", port["id"], timeout=30)["status"] == "active"
    for name in ("wtw", "wtv"):
        run(["ip", "netns", "del", lab.ns(name)])


def log_from(lab, offset: int) -> list[str]:
    """The lines the lab controller logged since `offset` (a size of its log)."""
    with open(lab.dir / "controller.log", "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()


def gave_up(lines: list[str], nodes) -> dict[str, tuple[datetime.datetime, str]]:
    """switch ("br-int compute2", ...) -> when the controller gave up waiting for it, and on what."""
    out = {}
    for line in lines:
        got = re.match(r"(\S+ \S+) WARNING fathom.reconciler: (\S+ (\S+)): switch \w+: no reply to (.+) within "
                       r"[\d.]+ s: left alone until it answers", line)
        if got and got[3] in nodes and got[2] not in out:
            out[got[2]] = (datetime.datetime.strptime(got[1], "%Y-%m-%d %H:%M:%S,%f"), got[4])
    return out


def test_two_nodes_paused_at_once_hold_a_sync_and_the_check_one_wait(lab):
    """compute2's and gw's ovs-vswitchd paused together: a sync reads every switch back, and the
    periodic check counts every switch's flows. Each asks all of them at once and awaits the replies
    under one wait, so the silent switches are given up together (the controller's own log: within
    REPLY_WAIT of each other; one by one, REPLY_WAIT apart), and the sync's reads and changes (its
    `make` step, in its pass's log line) take about one REPLY_WAIT, not one per silent switch. A port
    on compute1 turns `active` meanwhile."""
    api = Client.for_lab(lab.state())
    nodes = ("compute2", "gw")
    log = lab.dir / "controller.log"
    for phase in ("sync", "check"):
        offset = log.stat().st_size
        with paused(lab, *nodes):
            if phase == "sync":
                sync = api.sync()
                assert sync["compute1"]["switch"] == "ok", (sync, controller_log(lab))
            for node in nodes:
                api.wait_until(f"/nodes/{api.find('nodes', node)['id']}", lambda n: n["status"] == "pending",
                               CHECK_INTERVAL + HELD)
            lines = log_from(lab, offset)
            silent = gave_up(lines, nodes)
            # at least each node's br-int (its br-phy too where the controller programs it)
            assert {key.split()[1] for key in silent} == set(nodes), (silent, controller_log(lab))
            when = sorted(t for t, _what in silent.values())
            assert (when[-1] - when[0]).total_seconds() < REPLY_WAIT, (silent, controller_log(lab))
            if phase == "sync" and all(what == "a group read" for _t, what in silent.values()):
                # the sync asked them (not a check that came first): its pass waited once
                made = [float(m[1]) for line in lines if "(audit)" in line
                        for m in [re.search(r"\bmake ([\d.]+)", line)] if m]
                assert made and REPLY_WAIT * 1000 <= made[0] < 2 * REPLY_WAIT * 1000, (made, controller_log(lab))
            name, mac, ip = {"sync": ("wts", "02:fa:00:00:01:65", "198.19.1.65"),
                             "check": ("wtc", "02:fa:00:00:01:66", "198.19.1.66")}[phase]
            port = new_port(api, lab, name, mac, ip)
            got = api.wait_status("ports", port["id"], timeout=HELD)
            assert got["status"] == "active", (got, controller_log(lab))
        caught_up(api, lab)
        assert api.find("nodes", "gw")["status"] == "active"
        run(["ip", "netns", "del", lab.ns(name)])
