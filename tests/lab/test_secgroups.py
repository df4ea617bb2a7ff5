"""Security groups on real OVS (userspace datapath, the lab's): nc and ping between VMs, from allowed and
denied sources, TCP and UDP, on one node, across the tunnel, and routed across the VLAN uplink.

Project p: blue (VXLAN) and green (VLAN) joined by a router. srv (c1, blue) is in group web only:
ingress TCP 8080 from anywhere, UDP 5353 from members of p's default group, ICMP from green's
prefix, egress nothing. Every other VM of p is in p's default group (as the lab made them). Project
q's VM q1 shares the nodes.

Witnesses: what nc and ping in the VMs' namespaces get, nothing else. The controller is the lab's,
and every change waits for the security group to be `active` (its flows on every switch).
"""
import os
import signal
import subprocess
import threading
import time
import uuid

import pytest

from fathom.auth.client import lab_token
from fathom.client import Client
from fathom.host import exec as host_exec
from fathom.lab.capture import Capture
from fathom.lab.ovs import wait_for

from .util import lab_api, listening, ping, running_lab, sh, wait_listening

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1301, cidr: 198.19.31.0/24, project: p}
  - {name: green, type: vlan, segmentation_id: 141, cidr: 198.19.32.0/24, project: p}
  - {name: qnet, type: vxlan, segmentation_id: 1302, cidr: 198.19.33.0/24, project: q}
routers:
  - {name: r, networks: [blue, green]}
nodes:
  - name: c1
    vms:
      - {name: srv, mac: "02:fc:00:00:31:0b", ip: 198.19.31.11/24, network: blue}
      - {name: near, mac: "02:fc:00:00:31:0c", ip: 198.19.31.12/24, network: blue}
  - name: c2
    vms:
      - {name: far, mac: "02:fc:00:00:31:15", ip: 198.19.31.21/24, network: blue}
      - {name: grn, mac: "02:fc:00:00:32:16", ip: 198.19.32.22/24, network: green}
      - {name: q1, mac: "02:fc:00:00:33:17", ip: 198.19.33.23/24, network: qnet}
"""
SRV = "198.19.31.11"
IPS = {"srv": SRV, "near": "198.19.31.12", "far": "198.19.31.21", "grn": "198.19.32.22", "q1": "198.19.33.23"}


@pytest.fixture(scope="module")
def lab():
    with running_lab("sg1", TOPOLOGY, standalone=False) as lab:
        yield lab


@pytest.fixture(scope="module")
def api(lab):
    return lab_api(lab)


@pytest.fixture(scope="module")
def web(lab, api):
    """Group web on srv (instead of the default group); its rules by name."""
    group = api.post("/security-groups", json={"name": "web", "project_id": "p"}).json()
    rules = {}
    for name, body in (("tcp8080", {"protocol": "tcp", "port_range_min": 8080}),
                       ("udp5353", {"protocol": "udp", "port_range_min": 5353,
                                    "remote_group_id": _default(api, "p")["id"]}),
                       ("icmp", {"protocol": "icmp", "remote_ip_prefix": "198.19.32.0/24"})):
        r = api.post("/security-group-rules", json={"security_group_id": group["id"], "direction": "ingress", **body})
        assert r.status_code == 201, r.text
        rules[name] = r.json()["id"]
    srv = api.get("/ports", params={"name": "srv"}).json()[0]
    r = api.patch(f"/ports/{srv['id']}", json={"security_groups": [group["id"]]})
    assert r.status_code == 200, r.text
    _settle(lab, group["id"], srv["id"])
    for rule_id in rules.values():
        _rule_on_switch(lab, rule_id)
    return {"id": group["id"], "rules": rules, "port": srv["id"]}


def _default(api, project: str) -> dict:
    return next(g for g in api.get("/security-groups").json() if g["project_id"] == project and g["name"] == "default")


def _client(lab) -> Client:
    state = lab.state()
    return Client(state["controller"]["url"], token=lab_token(state))


def _settle(lab, group_id: int, *port_ids: int) -> None:
    """Wait until the group and ports are active: every switch holds their flows."""
    client = _client(lab)
    got = [client.wait_status("security-groups", group_id, want="active", timeout=60)]
    got += [client.wait_status("ports", pid, want="active", timeout=60) for pid in port_ids]
    assert all(o["status"] == "active" for o in got), got


def _on_switch(lab, table: int, text: str, present: bool = True, node: str = "c1") -> None:
    """Wait until a flow of `table` containing `text` is (or is no longer) on the node's br-int, read
    with ovs-ofctl: a status written by a pass that began before the change may still say `active`."""
    def holds() -> bool:
        flows = sh(lab, node, "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", "br-int", f"table={table}").stdout
        return (text in flows) == present
    wait_for(holds, timeout=30, what=f"{text} {'on' if present else 'off'} {node}'s br-int table {table}")


def _rule_on_switch(lab, rule_id: int, present: bool = True) -> None:
    _on_switch(lab, 75, f"conj_id={rule_id},", present)   # the rule's commit flow in ingress-acl


def _ns(lab, vm: str) -> list[str]:
    """The prefix that runs a command in `vm`."""
    return host_exec.argv([], lab.ns(vm))


def tcp(lab, src: str, dst: str, port: int) -> bool:
    """A TCP connection src -> dst:port carries a line to a listener (the handshake needs both ways)."""
    token = uuid.uuid4().hex
    # a listener left behind would share the port (nc listens with SO_REUSEPORT) and take connections
    assert not listening(lab, dst, port), f"{dst}:{port} already has a listener"
    server = subprocess.Popen([*_ns(lab, dst), "timeout", "6", "nc", "-l", IPS[dst], str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        wait_listening(lab, dst, port)
        subprocess.run([*_ns(lab, src), "sh", "-c", f"echo {token} | timeout 3 nc -N -w 2 {IPS[dst]} {port}"],
                       capture_output=True, timeout=10)
    finally:
        out = _heard(server)
    return token in out


def udp(lab, src: str, dst: str, port: int) -> tuple[bool, bool]:
    """(the datagram src -> dst:port arrived, the listener's answer came back)."""
    token = uuid.uuid4().hex
    server = subprocess.Popen([*_ns(lab, dst), "sh", "-c", f"echo pong | timeout 6 nc -u -l {IPS[dst]} {port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        wait_listening(lab, dst, port, udp=True)
        got = subprocess.run([*_ns(lab, src), "sh", "-c", f"echo {token} | timeout 3 nc -u -w 2 {IPS[dst]} {port}"],
                             capture_output=True, text=True, timeout=10).stdout
    finally:
        out = _heard(server)
    return token in out, "pong" in got


def _heard(server: subprocess.Popen) -> str:
    """What a listener printed, once its client is done (the client has waited for the answer or
    given up): it gets a second to print and end; one that nothing reached (a UDP listener, or a
    connection the rules dropped) would wait out its `timeout`, so it is stopped instead."""
    try:
        return server.communicate(timeout=1)[0]
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGTERM)
        return server.communicate(timeout=10)[0]


def pings(lab, src: str, dst: str) -> bool:
    return " 0% packet loss" in ping(lab, src, IPS[dst], count=2).stdout


def test_rules_allow_and_deny_as_written(lab, web):
    # TCP 8080 from anywhere: same node, across the tunnel, routed across the VLAN uplink
    assert [tcp(lab, src, "srv", 8080) for src in ("near", "far", "grn")] == [True, True, True]
    # no rule for 8081
    assert [tcp(lab, src, "srv", 8081) for src in ("near", "far", "grn")] == [False, False, False]
    # UDP 5353 from members of the default group, and the answer comes back; 5354 has no rule
    assert udp(lab, "far", "srv", 5353) == (True, True)
    assert udp(lab, "grn", "srv", 5353) == (True, True)
    assert udp(lab, "far", "srv", 5354) == (False, False)
    # ICMP from green's prefix only
    assert pings(lab, "grn", "srv") and not pings(lab, "near", "srv") and not pings(lab, "far", "srv")
    # srv's group has no egress rule: it answers but never opens anything
    assert not pings(lab, "srv", "near") and not tcp(lab, "srv", "far", 8080)


def test_the_default_group_admits_its_members_both_ways(lab, web):
    assert tcp(lab, "near", "far", 9000) and tcp(lab, "far", "near", 9000)     # across the tunnel
    assert tcp(lab, "grn", "near", 9000) and tcp(lab, "near", "grn", 9000)     # routed
    assert udp(lab, "near", "grn", 9001) == (True, True)
    assert pings(lab, "far", "grn")


def test_tenants_stay_isolated(lab, web):
    # q1 is in q's default group; p's VMs are no members of it, and no router joins the projects
    assert not pings(lab, "q1", "far") and not tcp(lab, "q1", "srv", 8080)
    assert not tcp(lab, "far", "q1", 9000)


class Stream:
    """A TCP connection src -> dst:port sending a numbered line every 100 ms; the listener's output
    says which lines arrived."""

    def __init__(self, lab, src: str, dst: str, port: int):
        # the listener takes one connection and stops listening, so the port is free for tcp()
        server = ("import socket, sys\n"
                  f"listener = socket.create_server(('{IPS[dst]}', {port}))\n"
                  "conn, _ = listener.accept()\n"
                  "listener.close()\n"
                  "for line in conn.makefile():\n"
                  "    sys.stdout.write(line)\n"
                  "    sys.stdout.flush()\n")
        self.server = subprocess.Popen([*_ns(lab, dst), "python3", "-c", server],
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        wait_listening(lab, dst, port)
        script = ("import socket, time\n"
                  f"s = socket.create_connection(('{IPS[dst]}', {port}), timeout=5)\n"
                  "for i in range(550):\n"
                  "    s.sendall(b'line %d\\n' % i)\n"
                  "    time.sleep(0.1)\n")
        self.client = subprocess.Popen([*_ns(lab, src), "python3", "-c", script],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.server.stdout:
            self.lines.append(line.strip())

    def arriving(self, seconds: float = 1.5) -> bool:
        """Whether lines keep arriving over the next `seconds`."""
        before = len(self.lines)
        time.sleep(seconds)
        return len(self.lines) > before

    def close(self):
        for p in (self.client, self.server):
            p.kill()
            p.wait(timeout=10)


def _established(lab, node: str, src: str, dst: str, port: int) -> list[str]:
    """The node's conntrack entries (any zone) of established TCP connections src -> dst:port."""
    out = lab.ovs(node).appctl("dpctl/dump-conntrack")
    return [line for line in out.splitlines()
            if line.startswith("tcp,") and f"src={IPS[src]},dst={IPS[dst]}," in line and f"dport={port})" in line
            and "state=ESTABLISHED" in line]


@pytest.mark.parametrize("src", ["far", "near"], ids=["across the tunnel", "same node and network"])
def test_established_survives_an_unrelated_change_and_dies_with_its_rule(lab, api, web, src):
    stream = Stream(lab, src, "srv", 8080)
    try:
        assert stream.arriving()
        if src == "near":
            # one entry in blue's zone holds both sides: near's egress rule (default group) in the
            # mark, srv's ingress rule in the labels
            egress = next(r["id"] for r in _default(api, "p")["rules"]
                          if r["direction"] == "egress" and r["ethertype"] == "IPv4")
            entries = _established(lab, "c1", src, "srv", 8080)
            assert len(entries) == 1, entries
            assert f"mark={egress}," in entries[0] and f"labels={web['rules']['tcp8080']:#x}" in entries[0], entries
        # an unrelated rule added, and one removed: the connection goes on
        extra = api.post("/security-group-rules", json={"security_group_id": web["id"], "direction": "ingress",
                                                        "protocol": "tcp", "port_range_min": 443}).json()
        _settle(lab, web["id"])
        _rule_on_switch(lab, extra["id"])
        assert stream.arriving()
        assert api.delete(f"/security-group-rules/{extra['id']}").status_code == 204
        _settle(lab, web["id"])
        _rule_on_switch(lab, extra["id"], present=False)
        assert stream.arriving()
        # the rule that admitted it removed: nothing more arrives
        assert api.delete(f"/security-group-rules/{web['rules']['tcp8080']}").status_code == 204
        _settle(lab, web["id"])
        _rule_on_switch(lab, web["rules"]["tcp8080"], present=False)
        time.sleep(0.5)
        assert not stream.arriving(2.0), stream.lines[-3:]
        assert not tcp(lab, "near", "srv", 8080)
    finally:
        stream.close()
    # the rule back (a new rule): new connections again
    r = api.post("/security-group-rules", json={"security_group_id": web["id"], "direction": "ingress",
                                                "protocol": "tcp", "port_range_min": 8080})
    web["rules"]["tcp8080"] = r.json()["id"]
    _settle(lab, web["id"])
    _rule_on_switch(lab, web["rules"]["tcp8080"])
    assert tcp(lab, "near", "srv", 8080)


def test_port_security_off_disables_filtering(lab, api, web):
    assert not tcp(lab, "near", "srv", 8081)
    r = api.patch(f"/ports/{web['port']}", json={"port_security": False, "security_groups": []})
    assert r.status_code == 200, r.text
    assert _client(lab).wait_status("ports", web["port"], want="active", timeout=60)["status"] == "active"
    _on_switch(lab, 32, f"reg5={web['port']:#x} ", present=False)    # no conntrack for srv any more
    try:
        assert tcp(lab, "near", "srv", 8081) and pings(lab, "near", "srv") and udp(lab, "far", "srv", 5354) == (True, True)
    finally:
        r = api.patch(f"/ports/{web['port']}", json={"port_security": True, "security_groups": [web["id"]]})
        assert r.status_code == 200, r.text
        _settle(lab, web["id"], web["port"])
        _on_switch(lab, 32, f"reg5={web['port']:#x} ")
    assert not tcp(lab, "near", "srv", 8081)


def test_a_tap_copies_what_the_groups_then_drop(lab, api, web, tmp_path):
    """docs/security-groups.md: a tap copies at the sender's edge, before the security stages, and its
    copies reach the monitor (on another node, through the tunnel) past the monitor's groups."""
    r = api.post("/taps", json={"sender": "near", "receiver": "srv", "monitor": "grn", "project_id": "p",
                                "ip_proto": "tcp", "tp_dst": 8081})
    assert r.status_code == 201, r.text
    tap = r.json()["id"]
    try:
        assert _client(lab).wait_status("taps", tap, want="active", timeout=60)["status"] == "active"
        with Capture(lab.ns("grn"), "eth0", tmp_path / "grn.pcap", f"tcp and dst host {SRV} and dst port 8081") as cap:
            assert not tcp(lab, "near", "srv", 8081)    # srv's group drops it ...
        seen = cap.fields("ip.dst", "tcp.dstport")
        assert (SRV, "8081") in seen, seen              # ... and the monitor got the copy
    finally:
        api.delete(f"/taps/{tap}")
