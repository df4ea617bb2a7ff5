"""DHCP answered on the node by its agent's dnsmasq, on real OVS in real namespaces.

One lab (`dh1`): network blue (VXLAN, tenant t1; DNS server and a host route on its subnet) with
VMs d1 on c1 and d2 on c2 taking their address by DHCP and r1 on c1 (static), network green (VLAN,
tenant t2) with VM g1 on c1 by DHCP. Every port has port security and its project's default
security group (ingress only from the group's members: never from the DHCP server's address).

* d1 and d2 each get, from the server of their own node: their port's address, the /24 mask, the
  router, MTU 1450 (VXLAN), the DNS server and the host route (option 121, with the default route);
  the VM applies them (eth0's MTU, routes); they reach each other with the leased addresses.
* g1 on the VLAN network gets MTU 1500; blue's DHCP port on c1 never sees a frame from g1 (tcpdump
  on it as the witness), green's does.
* A running client renews by unicast through its default security group (the server's answer
  passes, as Neutron always allows DHCP), and after the subnet's DNS servers and host routes are
  changed, a renewal brings the new ones; the subnet shows its servers active per node.
* r1 cannot act as a DHCP server: what it sends from udp 67 to 68 never reaches d1 (tcpdump in d1),
  while the same datagram from another source port does.
"""
import contextlib
import json
import signal
import subprocess

import pytest

from fathom.host import exec as host_exec
from fathom.lab.capture import Capture
from fathom.lab.ovs import wait_for

from .util import lab_api, running_lab, sh

TOPOLOGY = """
networks:
  - name: blue
    type: vxlan
    segmentation_id: 3201
    cidr: 198.19.91.0/24
    project: t1
    dns: [192.0.2.53]
    host_routes: [{destination: 203.0.113.0/24, nexthop: 198.19.91.5}]
  - {name: green, type: vlan, segmentation_id: 392, cidr: 198.19.92.0/24, project: t2}
routers:
  - {name: rb, networks: [blue]}
nodes:
  - name: c1
    vms:
      - {name: d1, mac: "02:fd:00:00:91:0b", ip: 198.19.91.11/24, network: blue, dhcp: true}
      - {name: r1, mac: "02:fd:00:00:91:15", ip: 198.19.91.21/24, network: blue}
      - {name: g1, mac: "02:fd:00:00:92:0b", ip: 198.19.92.11/24, network: green, dhcp: true}
  - name: c2
    vms: [{name: d2, mac: "02:fd:00:00:91:0c", ip: 198.19.91.12/24, network: blue, dhcp: true}]
"""


@pytest.fixture(scope="module")
def lab():
    with running_lab("dh1", TOPOLOGY, standalone=False) as lab:
        yield lab


def _lease(lab, vm: str) -> dict:
    """The VM's lease, once its node's agent runs the server (the agent follows the controller)."""
    got = {}

    def once():
        try:
            got.update(lab.dhcp_vm(vm, timeout=15))
            return True
        except Exception:  # noqa: BLE001 - no server yet: ask again
            return False
    wait_for(once, 90, f"a DHCP lease for {vm}")
    return got


def _mtu(lab, vm: str) -> int:
    return json.loads(sh(lab, vm, "ip", "-j", "link", "show", "eth0").stdout)[0]["mtu"]


def test_vms_get_their_lease_from_their_own_node(lab):
    d1, d2 = _lease(lab, "d1"), _lease(lab, "d2")
    assert d1["ip"] == "198.19.91.11" and d2["ip"] == "198.19.91.12"
    for lease in (d1, d2):
        assert lease["mask"] == "24" and lease["router"].split()[0] == "198.19.91.1"
        assert lease["mtu"] == "1450"
        assert lease["dns"].split() == ["192.0.2.53"]
        # option 121: the host route, and the default route (a client given option 121 ignores option 3)
        assert lease["staticroutes"].split() == ["203.0.113.0/24", "198.19.91.5", "0.0.0.0/0", "198.19.91.1"]
    assert _mtu(lab, "d1") == 1450 and _mtu(lab, "d2") == 1450
    routes = sh(lab, "d1", "ip", "route").stdout
    assert "default via 198.19.91.1" in routes and "203.0.113.0/24 via 198.19.91.5" in routes
    assert sh(lab, "d1", "ping", "-c", "3", "-i", "0.2", "-W", "1", "198.19.91.12", check=False).returncode == 0
    # asked again: the same static lease
    assert lab.dhcp_vm("d1")["ip"] == "198.19.91.11"


def test_another_networks_vm_never_reaches_this_networks_server(lab, tmp_path):
    networks = {n["name"]: n["id"] for n in lab_api(lab).get("/networks").json()}
    _lease(lab, "d1")                   # blue's server on c1 runs
    with contextlib.ExitStack() as stack:   # green's own port is the positive control of the witness
        caps = {name: stack.enter_context(Capture(lab.ns("c1"), f"dhp{networks[name]}", tmp_path / f"{name}.pcap",
                                                  "ether src 02:fd:00:00:92:0b"))
                for name in ("blue", "green")}
        g1 = _lease(lab, "g1")
        assert g1["ip"] == "198.19.92.11" and g1["serverid"].startswith("198.19.92.")
        assert g1["mtu"] == "1500" and g1["dns"] == ""      # a VLAN network; no DNS server on its subnet
    seen = {name: cap.fields("udp.srcport", "udp.dstport") for name, cap in caps.items()}
    assert ("68", "67") in seen["green"], f"green's DHCP port saw no DHCP request from g1: {seen['green']!r}"
    assert seen["blue"] == [], f"blue's DHCP port saw green's VM: {seen['blue']}"


class _Client:
    """udhcpc left running in a VM (as a cloud image's client is), its leases read as they come:
    `renew()` sends SIGUSR1 (`ip netns exec` execs udhcpc: the process is the client) and returns
    the next lease (udhcpc's variables). `-T 5`: a renewal waits 5 s for the server's unicast
    answer before broadcasting (room for a crowded machine; the test requires the unicast answer)."""

    def __init__(self, lab, vm: str):
        self.proc = subprocess.Popen(
            host_exec.argv(["udhcpc", "-i", "eth0", "-f", "-t", "4", "-T", "5",
             "-O", "mtu", "-O", "staticroutes", "-s", str(lab.dir / "udhcpc.sh")], lab.ns(vm)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []

    def next_lease(self, what: str) -> dict:
        lease: dict = {}

        def complete():
            line = self.proc.stdout.readline()
            if line:
                self.lines.append(line)
                if line.startswith("LEASE ") and "=" in line:
                    key, value = line[len("LEASE "):].rstrip("\n").split("=", 1)
                    lease[key] = value
            return "serverid" in lease      # the script's last line of a lease
        wait_for(complete, 30, what)
        return lease

    def renew(self, what: str) -> dict:
        self.proc.send_signal(signal.SIGUSR1)
        return self.next_lease(what)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _port_of(lab, vm: str) -> dict:
    return next(p for p in lab_api(lab).get("/ports").json() if p["interface_name"] == vm)


def test_a_running_client_renews_with_its_server_through_its_security_group(lab):
    """A unicast REQUEST to the server (whose address br-int resolves by ARP), answered through
    the port's default security group (which admits nothing from the server's address)."""
    port = _port_of(lab, "d2")
    assert port["port_security"] and port["security_groups"], "d2's port must be filtered for this test to mean anything"
    _lease(lab, "d2")
    client = _Client(lab, "d2")
    try:
        first = client.next_lease("d2's first lease")
        renewed = client.renew("d2's renewed lease")
    finally:
        client.close()
    assert first["ip"] == renewed["ip"] == "198.19.91.12", client.output
    # the renewal went by unicast to the server (the switch answered ARP for it), no fallback
    assert "sending renew to server" in client.output and "broadcasting renew" not in client.output, client.output


def test_a_renewal_after_a_subnet_update_brings_the_new_options(lab):
    api = lab_api(lab)
    subnet = next(x for x in api.get("/subnets").json() if x["name"] == "blue")
    _lease(lab, "d1")
    client = _Client(lab, "d1")
    try:
        assert client.next_lease("d1's lease")["dns"].split() == ["192.0.2.53"]
        r = api.patch(f"/subnets/{subnet['id']}", json={
            "dns_nameservers": ["192.0.2.54", "192.0.2.55"],
            "host_routes": [{"destination": "203.0.113.0/24", "nexthop": "198.19.91.5"},
                            {"destination": "198.51.100.0/24", "nexthop": "198.19.91.6"}]})
        assert r.status_code == 200, r.text
        got: dict = {}

        def renewed_with_new_options():
            # the agent rewrites dnsmasq's options and reloads it; until then a renewal brings the old
            got.update(client.renew("d1's renewed lease"))
            return got["dns"].split() == ["192.0.2.54", "192.0.2.55"]
        wait_for(renewed_with_new_options, 60, "a renewal with the new DNS servers")
    finally:
        client.close()
    assert got["ip"] == "198.19.91.11"
    assert got["staticroutes"].split() == ["203.0.113.0/24", "198.19.91.5", "198.51.100.0/24", "198.19.91.6",
                                           "0.0.0.0/0", "198.19.91.1"]
    assert "198.51.100.0/24 via 198.19.91.6" in sh(lab, "d1", "ip", "route").stdout

    def servers_active():
        rows = api.get(f"/subnets/{subnet['id']}").json()["dhcp_status"]
        return sorted((r["node"], r["status"]) for r in rows) == [("c1", "active"), ("c2", "active")]
    wait_for(servers_active, 30, "blue's DHCP servers active on c1 and c2")
    assert api.get(f"/networks/{subnet['network_id']}").json()["status"] == "active"


def test_a_vm_cannot_answer_dhcp_for_others(lab, tmp_path):
    """r1 (static, port security) sends DHCP-answer-shaped datagrams (udp 67 -> 68, broadcast):
    the security stage of its node drops them; the same from source port 1067 reaches d1."""
    _lease(lab, "d1")
    send = ("import socket,sys; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); "
            "s.setsockopt(socket.SOL_SOCKET,socket.SO_BROADCAST,1); s.bind(('198.19.91.21',int(sys.argv[1]))); "
            "[s.sendto(b'rogue dhcp answer',('255.255.255.255',68)) for _ in range(5)]")
    seen = {}
    for sport in (67, 1067):      # 1067: the positive control of the witness
        with Capture(lab.ns("d1"), "eth0", tmp_path / f"{sport}.pcap", "udp and src host 198.19.91.21") as cap:
            sh(lab, "r1", "python3", "-c", send, str(sport))
        seen[sport] = cap.fields("udp.srcport", "ip.dst", "udp.dstport")
    assert ("1067", "255.255.255.255", "68") in seen[1067], f"the control datagram did not reach d1: {seen[1067]!r}"
    assert seen[67] == [], f"r1's DHCP answers reached d1: {seen[67]}"
