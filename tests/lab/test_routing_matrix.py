"""Routed traffic between every pair of nodes, both directions, in every router mode, on real OVS.

One router joins six networks: a VXLAN and a VLAN network per compute node c1..c3, each with its only
VM on that node, so every routed pair crosses between nodes that host only one side of it (the
VXLAN->VLAN, VLAN->VXLAN and VLAN->VLAN paths of docs/fabric.md, "Routing and VLAN trunks"). A
fourth node c4 hosts both sides: a VM of nv1 and a VM of nx2, so in `distributed` mode it routes into
nv1 itself and then, in the other modes, sends to nv1's gateway over its trunk.

The lab stays up; the router moves distributed -> network-node -> distributed (and three more round
trips) -> fabric in place
(fabric routes VLAN networks only: the VXLAN interfaces are removed first). In each mode every VM pings
every VM of another network at once (2 echoes, 200 ms apart), and the echoes must come back routed
once each way (TTL 63). The fabric switch's trunks are read with ovs-ofctl and compared with the rule, and the
fabric switch's drop counter must not move, neither in the pings nor in the moves between modes.
"""
import re
import subprocess
import time
from itertools import permutations

import pytest

from fathom.lab.ovs import wait_for

from .util import await_status, controller_log, running_lab, sh, fabric_vlans, lab_api as api

NETWORKS = {   # name -> (type, segmentation id, third octet)
    "nx1": ("vxlan", 2001, 61), "nv1": ("vlan", 131, 71),
    "nx2": ("vxlan", 2002, 62), "nv2": ("vlan", 132, 72),
    "nx3": ("vxlan", 2003, 63), "nv3": ("vlan", 133, 73),
}
VMS = {   # name -> (node, network, host)
    "x1": ("c1", "nx1", 11), "v1": ("c1", "nv1", 11),
    "x2": ("c2", "nx2", 12), "v2": ("c2", "nv2", 12),
    "x3": ("c3", "nx3", 13), "v3": ("c3", "nv3", 13),
    "m1": ("c4", "nv1", 14), "m2": ("c4", "nx2", 14),
}
NODES = ("c1", "c2", "c3", "c4")


def _ip(vm: str) -> str:
    _, net, host = VMS[vm]
    return f"198.19.{NETWORKS[net][2]}.{host}"


def _topology() -> str:
    lines = ["networks:"]
    lines += [f"  - {{name: {n}, type: {t}, segmentation_id: {seg}, cidr: 198.19.{o}.0/24}}"
              for n, (t, seg, o) in NETWORKS.items()]
    lines += ["routers:", f"  - {{name: r, networks: [{', '.join(NETWORKS)}]}}", "nodes:"]
    for node in NODES:
        lines.append(f"  - name: {node}\n    vms:")
        lines += [f"      - {{name: {vm}, mac: \"02:fb:00:00:{NETWORKS[net][2]:02x}:{host:02x}\", "
                  f"ip: {_ip(vm)}/24, network: {net}}}" for vm, (n, net, host) in VMS.items() if n == node]
    lines += ["  - name: gw\n    role: gateway"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def lab():
    with running_lab("rtm", _topology(), standalone=False) as lab:
        yield lab


def router_id(lab) -> int:
    return next(r["id"] for r in api(lab).get("/routers").json() if r["name"] == "r")


def set_mode(lab, mode: str) -> None:
    c, rid = api(lab), router_id(lab)
    c.patch(f"/routers/{rid}", json={"mode": mode}).raise_for_status()
    await_status(c, f"/routers/{rid}")


def fabric_drops(lab) -> int:
    """Packets the fabric switch's trunk-in table dropped (a VLAN not allowed on the port it came in on)."""
    out = sh(lab, "fabric", "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", "br-fabric", "table=0").stdout
    return sum(int(n) for n in re.findall(r"n_packets=(\d+),.* priority=0 actions=drop", out))


def expected_trunks(mode: str, routed: set[str]) -> dict[str, set[int]]:
    """The rule of docs/fabric.md: a node's trunk carries the VLANs of the networks it hosts, plus
    every VLAN network of the router when it routes (distributed: it hosts one of the router's
    networks; network-node: the gateway node, which holds the router's interfaces)."""
    vlan = {n: seg for n, (t, seg, _) in NETWORKS.items() if t == "vlan"}
    out = {node: {vlan[net] for n, net, _ in VMS.values() if n == node and net in vlan} for node in NODES + ("gw",)}
    routes = {vlan[n] for n in routed if n in vlan}
    for node in out:
        hosts_a_leg = any(n == node and net in routed for n, net, _ in VMS.values())
        if (mode == "distributed" and hosts_a_leg) or (mode == "network-node" and node == "gw"):
            out[node] |= routes
    return out


def ping_all(lab, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Every (source VM, destination VM) pair pings at once: 2 echoes, 200 ms apart, 1 s to answer."""
    procs = {}
    for src, dst in pairs:
        argv, env = lab.exec_args(src, ["ping", "-n", "-c", "2", "-i", "0.2", "-W", "1", _ip(dst)])
        procs[(src, dst)] = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             text=True)
    return {pair: p.communicate(timeout=20)[0] for pair, p in procs.items()}


def echoes(out: str) -> tuple[int, set[str]]:
    """(echo replies received, their TTLs) from ping's output."""
    m = re.search(r"\d+ packets transmitted, (\d+) received", out)
    return (int(m.group(1)) if m else 0), set(re.findall(r"ttl=(\d+)", out))


def check_matrix(lab, mode: str, routed: set[str], drops: dict) -> None:
    """All VMs of the routed networks ping each other across networks; all echoes return, TTL 63;
    and the fabric switch dropped nothing since the last phase (the move to this mode included)."""
    vms = [vm for vm, (_, net, _) in VMS.items() if net in routed]
    pairs = [(a, b) for a, b in permutations(vms, 2) if VMS[a][1] != VMS[b][1]]
    # covered: every ordered pair of the one-sided nodes, for every kind of path the mode routes
    kinds = {("vlan", "vlan")} if mode == "fabric" else {("vxlan", "vlan"), ("vlan", "vxlan"), ("vlan", "vlan")}
    covered = {(VMS[a][0], VMS[b][0], NETWORKS[VMS[a][1]][0], NETWORKS[VMS[b][1]][0]) for a, b in pairs}
    assert {(x, y, *k) for x, y in permutations(("c1", "c2", "c3"), 2) for k in kinds} <= covered
    failed = []
    for (src, dst), out in sorted(ping_all(lab, pairs).items()):
        got, ttls = echoes(out)
        if got != 2 or ttls != {"63"}:   # every echo back, routed once each way
            failed.append(f"{src}@{VMS[src][0]} ({VMS[src][1]}) -> {dst}@{VMS[dst][0]} ({VMS[dst][1]}): "
                          f"{got} of 2 echoes, ttl {sorted(ttls)}")
    assert failed == [], f"{mode}: {len(failed)} of {len(pairs)} pairs failed:\n" + "\n".join(failed)
    # OVS credits a datapath flow's packets to its rules at the next revalidation, about once a
    # second, and to the rules that match *then*: wait, so that the next move's flow changes do not
    # book this phase's packets on the drop rule
    time.sleep(1.5)
    now = fabric_drops(lab)
    assert now == drops["seen"], f"the fabric switch dropped {now - drops['seen']} frames moving to {mode} or in its pings"


def check_trunks(lab, mode: str, routed: set[str]) -> None:
    want = expected_trunks(mode, routed)
    wait_for(lambda: fabric_vlans(lab) == want, 10, f"fabric switch trunks {want}")
    st = api(lab).get("/fabric/switches/1/status").json()
    assert st["in_sync"], st
    for p in st["ports"]:   # what each node's br-int really sends is allowed on its port
        assert p["vlans_blocked"] == [] and set(p["vlans_sent"]) <= set(p["vlans"]), (p, controller_log(lab))


ALL = set(NETWORKS)
VLANS = {n for n, (t, _, _) in NETWORKS.items() if t == "vlan"}


@pytest.fixture(scope="module")
def drops(lab):
    """The fabric switch's drop counter as the last phase left it."""
    return {"seen": fabric_drops(lab)}


def test_distributed(lab, drops):
    check_matrix(lab, "distributed", ALL, drops)
    check_trunks(lab, "distributed", ALL)


def test_status_is_not_in_sync_while_a_node_sends_a_blocked_vlan(lab):
    """Take c2's routed VLAN nv1 off its trunk behind the controller's back: until the next audit
    pass puts it back, status must name it as blocked, not say in sync."""
    c = api(lab)
    ofport = next(p["ofport"] for p in c.get("/fabric/switches/1/status").json()["ports"] if p["port"] == "c2")
    for _ in range(5):   # the controller's periodic audit may restore the flow first: try again
        sh(lab, "fabric", "ovs-ofctl", "-O", "OpenFlow14", "--strict", "del-flows", "br-fabric",
           f"table=0,priority=100,in_port={ofport},dl_vlan=131")
        st = c.get("/fabric/switches/1/status").json()
        port = next(p for p in st["ports"] if p["port"] == "c2")
        if 131 not in port["vlans"]:
            break
    assert 131 not in port["vlans"], "the flow kept coming back before status could see it gone"
    assert port["vlans_blocked"] == [131] and st["in_sync"] is False, st
    c.post("/sync").raise_for_status()
    wait_for(lambda: c.get("/fabric/switches/1/status").json()["in_sync"], 10, "back in sync")


def test_network_node(lab, drops):
    set_mode(lab, "network-node")
    check_matrix(lab, "network-node", ALL, drops)
    check_trunks(lab, "network-node", ALL)


def test_back_to_distributed(lab, drops):
    set_mode(lab, "distributed")
    check_matrix(lab, "distributed", ALL, drops)
    check_trunks(lab, "distributed", ALL)


def test_moves_back_and_forth(lab, drops):
    """Round trips between the modes on the same lab: every pair still routed after each move. On
    OVS's userspace datapath some established flows kept their old path after a move (the tables
    right, the cached flows not) until the agents flushed the datapaths the controller asked them to."""
    for _ in range(3):
        for mode in ("network-node", "distributed"):
            set_mode(lab, mode)
            check_matrix(lab, mode, ALL, drops)


def test_fabric(lab, drops):
    c, rid = api(lab), router_id(lab)
    # still distributed: c4 routes m2's echoes into nv1 itself, sending them from nv1's gateway MAC
    assert echoes(ping_all(lab, [("m2", "v1")])[("m2", "v1")]) == (2, {"63"})
    r = c.patch(f"/routers/{rid}", json={"mode": "fabric"})
    assert r.status_code == 409 and r.json()["detail"][0]["loc"] == ["body", "mode"], r.text
    subnets = {s["name"]: s["id"] for s in c.get("/subnets").json()}
    for net in sorted(ALL - VLANS):
        c.delete(f"/routers/{rid}/interfaces", params={"subnet_id": subnets[net]}).raise_for_status()
    set_mode(lab, "fabric")
    # now m1, on the same node, sends to that MAC up c4's trunk: first, alone, before any routed
    # frame from the fabric switch could teach a learning bridge on the way where that MAC really is
    out = ping_all(lab, [("m1", "v2")])[("m1", "v2")]
    assert echoes(out) == (2, {"63"}), out + controller_log(lab)
    check_matrix(lab, "fabric", VLANS, drops)
    check_trunks(lab, "fabric", VLANS)
