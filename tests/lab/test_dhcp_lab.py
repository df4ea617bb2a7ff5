"""DHCP answered on the node by its agent's dnsmasq, on real OVS in real namespaces.

One lab (`dh1`): network blue (tenant t1) with VMs d1 on c1 and d2 on c2, network green (tenant t2)
with VM g1 on c1; every VM takes its address by DHCP (busybox udhcpc).

* d1 and d2 each get their port's address, the /24 mask, the router and MTU 1450 (VXLAN) from the
  server of their own node; eth0's MTU is set to it; they reach each other with the leased addresses.
* Asking again gives the same lease (static only: dnsmasq has no dynamic pool).
* g1 (another tenant's network on the same node) gets its lease from green's server, and blue's
  DHCP port on c1 never sees a frame from g1 (tcpdump on it as the witness).
"""
import json
import signal
import subprocess
import time

import pytest

from fathom.lab.ovs import wait_for

from .util import lab_api, running_lab, sh

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 3201, cidr: 198.19.91.0/24, project: t1}
  - {name: green, type: vxlan, segmentation_id: 3202, cidr: 198.19.92.0/24, project: t2}
routers:
  - {name: rb, networks: [blue]}
nodes:
  - name: c1
    vms:
      - {name: d1, mac: "02:fd:00:00:91:0b", ip: 198.19.91.11/24, network: blue, dhcp: true}
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
    assert _mtu(lab, "d1") == 1450 and _mtu(lab, "d2") == 1450
    assert "default via 198.19.91.1" in sh(lab, "d1", "ip", "route").stdout
    assert sh(lab, "d1", "ping", "-c", "3", "-i", "0.2", "-W", "1", "198.19.91.12", check=False).returncode == 0
    # asked again: the same static lease
    assert lab.dhcp_vm("d1")["ip"] == "198.19.91.11"


def test_another_networks_vm_never_reaches_this_networks_server(lab):
    networks = {n["name"]: n["id"] for n in lab_api(lab).get("/networks").json()}
    _lease(lab, "d1")                   # blue's server on c1 runs
    caps = {}
    for name in ("blue", "green"):      # green's own port is the positive control of the witness
        caps[name] = subprocess.Popen(
            ["ip", "netns", "exec", lab.ns("c1"), "tcpdump", "-l", "-n", "-e", "-i", f"dhp{networks[name]}",
             "ether", "src", "02:fd:00:00:92:0b"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        assert all(c.poll() is None for c in caps.values()), "tcpdump did not start on a DHCP port"
        g1 = _lease(lab, "g1")
        assert g1["ip"] == "198.19.92.11" and g1["serverid"].startswith("198.19.92.")
        time.sleep(0.5)
    finally:
        seen = {}
        for name, c in caps.items():
            c.terminate()
            seen[name] = c.communicate(timeout=10)[0]
    assert "udp" in seen["green"] or ".67" in seen["green"], f"green's DHCP port saw nothing: {seen['green']!r}"
    assert seen["blue"].strip() == "", f"blue's DHCP port saw green's VM:\n{seen['blue']}"


def test_a_running_client_renews_with_its_server(lab):
    """udhcpc left running (as in a VM) and told to renew (SIGUSR1): a unicast REQUEST to the
    server (whose address br-int resolves by ARP), answered, the same address kept."""
    _lease(lab, "d2")
    proc = subprocess.Popen(["ip", "netns", "exec", lab.ns("d2"), "udhcpc", "-i", "eth0", "-f", "-t", "4", "-T", "2",
                             "-O", "mtu", "-O", "staticroutes", "-s", str(lab.dir / "udhcpc.sh")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def leases_seen(n):
        def check():
            line = proc.stdout.readline()
            if line:
                lines.append(line)
            return sum(1 for x in lines if x.startswith("LEASE ip=")) >= n
        return check
    try:
        wait_for(leases_seen(1), 30, "d2's first lease")
        proc.send_signal(signal.SIGUSR1)   # `ip netns exec` execs udhcpc: proc is the client
        wait_for(leases_seen(2), 30, "d2's renewed lease")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    out = "".join(lines)
    assert [x for x in lines if x.startswith("LEASE ip=")] == ["LEASE ip=198.19.91.12\n"] * 2, out
    # the renewal went by unicast to the server (the switch answered ARP for it), no fallback
    assert "sending renew to server" in out and "broadcasting renew" not in out, out
