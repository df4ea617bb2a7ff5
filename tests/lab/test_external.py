"""External connectivity on real OVS (docs/external.md): an upstream host on a VLAN provider network
reaches a VM through its floating IP; VMs without one reach the upstream through their router's SNAT
(two tenants with the same private addresses at once); a floating IP moves between ports while a
stream keeps flowing to it; tenants stay apart; ARP for a floating IP is answered only while it is
hosted; floating-IP traffic passes the destination port's ingress security groups. Witnesses: what
the endpoints themselves see (the peer address of a TCP connection, the datagrams a receiver gets),
and the upstream's neighbour table.

Every VM is in its project's default group (as the lab makes them), which admits ingress only from
its own members: the lab's `api` fixture adds to alpha's and beta's default group an ingress rule for
any IPv4, so the tests of NAT see NAT; the security group test narrows vm1's groups itself.

Lab `exl`: fathom/lab/topologies/external.yaml (blue and red share 198.19.1.0/24; vm1 has floating
IP 203.0.113.4; router ra's gateway is 203.0.113.2, rb's 203.0.113.3; the upstream `up` is .1).
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from fathom.client import Client
from fathom.lab.ovs import wait_for
from fathom.lab.topology import load

from .util import live_watchers_end, ping, running_lab, sh

TOPOLOGY = Path(__file__).resolve().parents[2] / "fathom/lab/topologies/external.yaml"
UPSTREAM = "203.0.113.1"

# Answers every TCP connection with "<its name> <the peer address it sees>".
TCP_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[2]))); s.listen(16)
while True:
    c, peer = s.accept(); c.sendall(f"{sys.argv[1]} {peer[0]}\\n".encode()); c.close()
"""
TCP_CLIENT = """
import socket, sys
s = socket.socket(); s.settimeout(3)
if len(sys.argv) > 3: s.bind(("0.0.0.0", int(sys.argv[3])))
s.connect((sys.argv[1], int(sys.argv[2]))); print(s.recv(100).decode().strip())
"""
UDP_RECEIVER = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 9000))
while True:
    data, peer = s.recvfrom(100); print(peer[0], flush=True)
"""
# One flow: the same source port all along, a datagram every 20 ms.
UDP_SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 5555))
while True:
    s.sendto(b"x", (sys.argv[1], 9000)); time.sleep(0.02)
"""


@pytest.fixture(scope="module")
def lab():
    with running_lab("exl", TOPOLOGY.read_text(), standalone=False) as lab:
        yield lab


@pytest.fixture(scope="module")
def api(lab):
    client = Client.for_lab(lab.state())
    for project in ("alpha", "beta"):
        open_ingress(lab, client, project, ("compute1", "compute2"))
    yield client
    client.close()


def default_group(api, project: str) -> dict:
    return next(g for g in api.get("/security-groups") if g["project_id"] == project and g["name"] == "default")


def acl_flows(lab, node: str) -> str:
    """br-int's ingress-acl table on `node`, as OVS holds it."""
    return sh(lab, node, "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", "br-int", "table=75").stdout


def rule_on(lab, node: str, rule_id: int, port: int | None = None, present: bool = True) -> None:
    """Wait until `node`'s ingress-acl holds (or no longer holds) rule `rule_id`: its commit flow, or
    with `port` the clause naming that port (reg9 = its id) in the rule's conjunction."""
    def holds() -> bool:
        lines = acl_flows(lab, node).splitlines()
        if port is None:
            found = any(f"conj_id={rule_id}," in line for line in lines)
        else:
            found = any(f"reg9={port:#x}" in line and f"conjunction({rule_id}," in line for line in lines)
        return found == present
    wait_for(holds, 30, f"rule {rule_id}{'' if port is None else f' for port {port}'} "
                        f"{'on' if present else 'off'} {node}'s ingress-acl")


def open_ingress(lab, api, project: str, nodes) -> None:
    """The project's default group admits any IPv4 (the upstream, other tenants through NAT)."""
    rule = api.post("/security-group-rules", json={"security_group_id": default_group(api, project)["id"],
                                                  "direction": "ingress", "ethertype": "IPv4"})
    for node in nodes:
        rule_on(lab, node, rule["id"])


class Background:
    """Processes started in lab namespaces, ended (by their own pid) when the test ends."""

    def __init__(self, lab):
        self.lab, self.procs = lab, []

    def start(self, target: str, *cmd: str) -> subprocess.Popen:
        argv, env = self.lab.exec_args(target, list(cmd))
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen) -> str:
        proc.kill()
        out, _ = proc.communicate(timeout=5)
        return out

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)


@pytest.fixture
def bg(lab):
    b = Background(lab)
    yield b
    b.close()


def tcp_ask(lab, src: str, ip: str, port: int, bind_port: int | None = None) -> str:
    args = ["python3", "-c", TCP_CLIENT, ip, str(port)] + ([str(bind_port)] if bind_port else [])
    for _ in range(10):   # the server may still be starting
        proc = sh(lab, src, *args, check=False)
        if proc.returncode == 0:
            return proc.stdout.strip()
        time.sleep(0.3)
    raise AssertionError(f"{src} -> {ip}:{port}: {proc.stderr}")


def port_id(api, name: str) -> int:
    return api.get("/ports", params={"name": name})[0]["id"]


def fip_of(api, name: str) -> dict:
    return api.get("/floatingips", params={"port_id": port_id(api, name)})[0]


def test_the_upstream_reaches_a_vm_through_its_floating_ip(lab, api, bg):
    fip = fip_of(api, "vm1")
    assert fip["floating_ip_address"] == "203.0.113.4" and fip["status"] == "active", fip
    assert " 0% packet loss" in ping(lab, "up", "203.0.113.4").stdout
    bg.start("vm1", "python3", "-c", TCP_SERVER, "vm1", "7000")
    # the VM sees the upstream's own address (DNAT only), the upstream talks to the floating IP
    assert tcp_ask(lab, "up", "203.0.113.4", 7000) == f"vm1 {UPSTREAM}"
    # the floating IP's MAC is the router gateway's: only the gateway node answered
    routers = {r["name"]: r for r in api.get("/routers")}
    neigh = sh(lab, "up", "ip", "neigh", "show", "203.0.113.4").stdout
    assert routers["ra"]["external_gateway"]["mac_address"] in neigh, neigh


def test_vms_without_floating_ip_reach_out_through_their_routers_snat(lab, api, bg):
    routers = {r["name"]: r for r in api.get("/routers")}
    assert routers["ra"]["external_gateway"]["ip_address"] == "203.0.113.2"
    assert routers["rb"]["external_gateway"]["ip_address"] == "203.0.113.3"
    bg.start("up", "python3", "-c", TCP_SERVER, "up", "7001")
    # vm2 (blue) and red2 (red) have the same private address; same source port too: each tenant's
    # connection is tracked in its own router's zone and leaves with its own gateway address
    assert tcp_ask(lab, "vm2", UPSTREAM, 7001, bind_port=40000) == "up 203.0.113.2"
    assert tcp_ask(lab, "red2", UPSTREAM, 7001, bind_port=40000) == "up 203.0.113.3"
    assert tcp_ask(lab, "red1", UPSTREAM, 7001) == "up 203.0.113.3"
    # a VM with a floating IP leaves with it
    assert tcp_ask(lab, "vm1", UPSTREAM, 7001) == "up 203.0.113.4"
    assert " 0% packet loss" in ping(lab, "red2", UPSTREAM).stdout


def test_tenants_reach_each_other_only_through_a_floating_ip(lab, api, bg):
    bg.start("vm1", "python3", "-c", TCP_SERVER, "vm1", "7002")
    bg.start("vm2", "python3", "-c", TCP_SERVER, "vm2", "7002")
    # red (tenant beta) reaches vm1 (alpha) through vm1's floating IP, hairpinned by the upstream,
    # and vm1 sees red's router gateway address
    assert tcp_ask(lab, "red1", "203.0.113.4", 7002) == "vm1 203.0.113.3"
    # not through alpha's router gateway address (no mapping for a new inbound connection) ...
    assert " 100% packet loss" in ping(lab, "red1", "203.0.113.2").stdout
    proc = sh(lab, "red1", "python3", "-c", TCP_CLIENT, "203.0.113.2", "7002", check=False)
    assert proc.returncode != 0
    # ... nor from outside to vm2's private address routed at alpha's gateway
    sh(lab, "up", "ip", "route", "replace", "198.19.1.0/24", "via", "203.0.113.2")
    try:
        assert " 100% packet loss" in ping(lab, "up", "198.19.1.12").stdout
        assert sh(lab, "up", "python3", "-c", TCP_CLIENT, "198.19.1.12", "7002", check=False).returncode != 0
    finally:
        sh(lab, "up", "ip", "route", "del", "198.19.1.0/24")


def test_a_floating_ip_moves_while_a_stream_flows_to_it(lab, api, bg):
    fip = fip_of(api, "vm1")
    first = bg.start("vm1", "python3", "-c", UDP_RECEIVER)
    bg.start("up", "python3", "-c", UDP_SENDER, fip["floating_ip_address"])
    time.sleep(1.5)
    assert bg.stop(first).split().count(UPSTREAM) > 10   # the stream reaches vm1
    api.patch(f"/floatingips/{fip['id']}", json={"port_id": port_id(api, "vm2")})
    api.wait_status("floatingips", fip["id"], "active", timeout=15)
    time.sleep(1.0)   # the pass that installed the new mapping has flushed the old one
    old = bg.start("vm1", "python3", "-c", UDP_RECEIVER)
    new = bg.start("vm2", "python3", "-c", UDP_RECEIVER)
    time.sleep(2.0)
    got_old, got_new = bg.stop(old).split(), bg.stop(new).split()
    # the same flow (same 5-tuple) now reaches vm2 only: the old conntrack entry did not survive
    assert got_old == [], got_old[:5]
    assert got_new.count(UPSTREAM) > 20, got_new[:5]
    # the other direction follows too: vm2 now leaves with the floating IP
    bg.start("up", "python3", "-c", TCP_SERVER, "up", "7003")
    assert tcp_ask(lab, "vm2", UPSTREAM, 7003) == "up 203.0.113.4"
    assert tcp_ask(lab, "vm1", UPSTREAM, 7003) == "up 203.0.113.2"


def test_a_floating_ip_not_associated_is_answered_nowhere(lab, api):
    fip = api.get("/floatingips")[0]
    api.patch(f"/floatingips/{fip['id']}", json={"port_id": None})
    api.sync()
    sh(lab, "up", "ip", "neigh", "flush", "dev", "eth0")
    assert " 100% packet loss" in ping(lab, "up", fip["floating_ip_address"], count=2).stdout
    assert "lladdr" not in sh(lab, "up", "ip", "neigh", "show", fip["floating_ip_address"]).stdout
    api.patch(f"/floatingips/{fip['id']}", json={"port_id": port_id(api, "vm1")})
    api.wait_status("floatingips", fip["id"], "active", timeout=15)
    assert " 0% packet loss" in ping(lab, "up", fip["floating_ip_address"]).stdout


def tcp_refused(lab, src: str, ip: str, port: int) -> bool:
    """A TCP connection src -> ip:port gets no answer (the client's 3 s timeout, or a reset)."""
    return sh(lab, src, "python3", "-c", TCP_CLIENT, ip, str(port), check=False).returncode != 0


def test_floating_ip_traffic_passes_the_ports_ingress_security_groups(lab, api, bg):
    """Inbound through a floating IP is delivered like any routed frame: the destination port's
    ingress rules decide, on the remote's own address (DNAT changed only the destination)."""
    fip = fip_of(api, "vm1")["floating_ip_address"]
    vm1 = port_id(api, "vm1")
    bg.start("vm1", "python3", "-c", TCP_SERVER, "vm1", "7005")
    assert tcp_ask(lab, "up", fip, 7005) == f"vm1 {UPSTREAM}"       # the default group (opened) admits it
    opened = next(r for r in default_group(api, "alpha")["rules"] if r["direction"] == "ingress"
                  and r["remote_ip_prefix"] is None and r["remote_group_id"] is None)
    group = api.post("/security-groups", json={"name": "fip-web", "project_id": "alpha"})
    try:
        # admitted: a rule for TCP 7005 from the upstream host's address only
        allow = api.post("/security-group-rules", json={
            "security_group_id": group["id"], "direction": "ingress", "protocol": "tcp",
            "port_range_min": 7005, "port_range_max": 7005, "remote_ip_prefix": f"{UPSTREAM}/32"})
        api.patch(f"/ports/{vm1}", json={"security_groups": [group["id"]]})
        rule_on(lab, "compute1", allow["id"], port=vm1)
        rule_on(lab, "compute1", opened["id"], port=vm1, present=False)
        assert tcp_ask(lab, "up", fip, 7005) == f"vm1 {UPSTREAM}"
        assert " 100% packet loss" in ping(lab, "up", fip).stdout      # no rule for ICMP
        # refused: the only rule now admits another prefix, not the upstream host
        other = api.post("/security-group-rules", json={
            "security_group_id": group["id"], "direction": "ingress", "protocol": "tcp",
            "port_range_min": 7005, "port_range_max": 7005, "remote_ip_prefix": "192.0.2.0/24"})
        api.delete(f"/security-group-rules/{allow['id']}")
        rule_on(lab, "compute1", other["id"], port=vm1)
        rule_on(lab, "compute1", allow["id"], present=False)
        assert tcp_refused(lab, "up", fip, 7005)
        # and admitted again once a rule names the upstream
        again = api.post("/security-group-rules", json={
            "security_group_id": group["id"], "direction": "ingress", "protocol": "tcp",
            "port_range_min": 7005, "port_range_max": 7005, "remote_ip_prefix": f"{UPSTREAM}/32"})
        rule_on(lab, "compute1", again["id"], port=vm1)
        assert tcp_ask(lab, "up", fip, 7005) == f"vm1 {UPSTREAM}"
    finally:
        api.patch(f"/ports/{vm1}", json={"security_groups": [default_group(api, "alpha")["id"]]})
        rule_on(lab, "compute1", opened["id"], port=vm1)
        api.delete(f"/security-groups/{group['id']}")


def test_live_trace_to_and_from_a_floating_ip(lab, api):
    """From vm1 out to the upstream host (it leaves with its floating IP) and from another tenant's
    VM to vm1's floating IP (hairpinned by the upstream): the live probe's verdict is the
    simulation's and ping's; the probe is seen crossing the gateway's ext0 with the addresses NAT
    gave it, and the answer comes back; no flow changes and no observation point stays loaded."""
    fip, vm1_ip = fip_of(api, "vm1")["floating_ip_address"], "198.19.1.11"
    red_gateway = api.find("routers", "rb")["external_gateway"]["ip_address"]

    def flows() -> dict[str, str]:
        return {f"{n} {b}": sh(lab, n, "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", "--no-stats", b).stdout
                for n in ("compute1", "compute2", "gw") for b in ("br-int", "br-phy")}

    before = flows()
    for src, to, result, out, back in (
            ("vm1", UPSTREAM, "uplink", [("gw", "ext0", "egress", fip, UPSTREAM)],
             [("gw", "ext0", "ingress", UPSTREAM, fip), ("compute1", "vm1", "egress", UPSTREAM, vm1_ip)]),
            ("red1", fip, "delivered", [("gw", "ext0", "egress", red_gateway, fip), ("gw", "ext0", "ingress", red_gateway, fip),
                                        ("compute1", "vm1", "egress", red_gateway, vm1_ip)],
             [("compute1", "red1", "egress", fip, vm1_ip)])):
        body = {"port_id": port_id(api, src), "to_ip": to}
        sim, lv = api.post("/traces", json=body), api.post("/traces", json={**body, "live": True})
        assert " 0% packet loss" in ping(lab, src, to).stdout
        assert sim["verdict"]["result"] == lv["verdict"]["result"] == result, (sim["verdict"], lv["verdict"])
        assert "no answer" not in lv["verdict"]["reason"], lv["verdict"]
        points = [(p["node"], p["dev"], p["dir"], p["src"], p["dst"], p["icmp_type"]) for p in lv["live"]["points"]]
        requests = [p[:5] for p in points if p[5] == 8 and p[2] != "injected"]
        replies = [p[:5] for p in points if p[5] == 0]
        assert requests[0][:3] == (sim["source"]["node"], src, "ingress"), points
        assert [p for p in requests if p[1] != "ul0"][-len(out):] == out, points
        assert [p for p in replies if p[1] != "ul0"][-len(back):] == back, points
    assert [h.get("time_us", 0) > 0 for h in lv["hops"] if h["bridge"] == "upstream"] == [True], lv["hops"]
    assert flows() == before
    live_watchers_end(lab, ())


# A flat external network, and a tenant VLAN network whose frames reach the gateway node over the
# uplink and the fabric switch (the fabric app must let the VLAN onto the gateway node's trunk).
FLAT = """
networks:
  - {name: ext, type: flat, cidr: 203.0.113.0/24, project: admin, external: true}
  - {name: green, type: vlan, segmentation_id: 130, cidr: 198.19.2.0/24, project: alpha}
routers:
  - {name: rg, networks: [green], external_gateway: ext}
nodes:
  - name: compute1
    vms:
      - {name: grn1, mac: "02:fa:00:00:03:01", ip: 198.19.2.21/24, network: green, floating_ip: true}
      - {name: grn2, mac: "02:fa:00:00:03:02", ip: 198.19.2.22/24, network: green}
  - name: gw
    role: gateway
upstream: {name: up, network: ext, node: gw}
"""


def test_flat_external_network_and_a_vlan_tenant_network():
    with running_lab("exf", FLAT, standalone=False) as lab:
        api = Client.for_lab(lab.state())
        bg = Background(lab)
        open_ingress(lab, api, "alpha", ("compute1",))
        try:
            fip = fip_of(api, "grn1")["floating_ip_address"]
            assert " 0% packet loss" in ping(lab, "up", fip).stdout
            bg.start("grn1", "python3", "-c", TCP_SERVER, "grn1", "7000")
            assert tcp_ask(lab, "up", fip, 7000) == f"grn1 {UPSTREAM}"
            bg.start("up", "python3", "-c", TCP_SERVER, "up", "7001")
            gateway = api.find("routers", "rg")["external_gateway"]["ip_address"]
            assert tcp_ask(lab, "grn2", UPSTREAM, 7001) == f"up {gateway}"
        finally:
            bg.close()
            api.close()
