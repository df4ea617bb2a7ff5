"""A port's `active` means it forwards (lab zp1): in a one-network tenant under the default security
group (each new port's address a remote-group member on the other node too), for several new ports
in both plug orders, the VM sends from before its port exists, as a booting VM does (its packets
leave the datapath with cached drops to revalidate), and one echo request issued the instant the
status turns active is answered (one request, no retry, sent by a prober started beforehand in the
VM, so nothing delays it), to a VM on the other node."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fathom.client import Client
from fathom.host import exec as host_exec
from fathom.lab.sh import run

from .util import running_lab

pytestmark = pytest.mark.lab

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 3101, cidr: 198.19.40.0/24, project: zp}
nodes:
  - name: c1
    vms:
      - {name: v1, mac: "02:0d:00:00:00:01", ip: 198.19.40.11/24, network: blue}
  - name: c2
    vms:
      - {name: v2, mac: "02:0d:00:00:00:02", ip: 198.19.40.12/24, network: blue}
underlay:
  mtu: 1600
"""
TARGET = ("198.19.40.12", "02:0d:00:00:00:02", "v2")
PORTS = 6
# In the VM: waits for a line on stdin, then sends one ICMP echo request to argv[1] and prints
# "answered" or "lost" after 2 s (ping's own start-up would give the datapath those milliseconds)
PROBER = """
import os, socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
ident = os.getpid() & 0xFFFF
def checksum(b):
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    t = (t >> 16) + (t & 0xFFFF)
    return ~(t + (t >> 16)) & 0xFFFF
body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"fathom" * 8
packet = body[:2] + struct.pack("!H", checksum(body)) + body[4:]
print("ready", flush=True)
sys.stdin.readline()
s.sendto(packet, (sys.argv[1], 0))
deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    s.settimeout(deadline - time.monotonic())
    try:
        data, peer = s.recvfrom(2048)
    except socket.timeout:
        break
    icmp = data[(data[0] & 0x0F) * 4:]
    if peer[0] == sys.argv[1] and icmp[0] == 0 and struct.unpack("!H", icmp[4:6])[0] == ident:
        print("answered", flush=True)
        sys.exit(0)
print("lost", flush=True)
"""


@pytest.fixture(scope="module")
def lab():
    with running_lab("zp1", TOPOLOGY, standalone=False) as lab:
        yield lab


def test_the_first_echo_issued_at_active_is_answered(lab):
    api = Client.for_lab(lab.state(), timeout=30)
    network = next(n["id"] for n in api.list("/networks") if n["name"] == "blue")
    ip, mac, target = TARGET
    answered = []
    for i in range(PORTS):
        name, vm_mac, vm_ip = f"n{i}", f"02:0d:00:00:01:{i:02x}", f"198.19.40.{100 + i}"
        lab.add_vm("c1", name, vm_mac, f"{vm_ip}/24", None)
        # static neighbours both ways: the echo is the first packet that needs the new port's flows
        run(["ip", "-n", lab.ns(name), "neigh", "replace", ip, "lladdr", mac, "dev", "eth0"])
        run(["ip", "-n", lab.ns(target), "neigh", "replace", vm_ip, "lladdr", vm_mac, "dev", "eth0"])
        booting = subprocess.Popen(host_exec.argv(["ping", "-q", "-i", "0.01", "-w", "30", ip], lab.ns(name)),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        prober = subprocess.Popen(host_exec.argv([sys.executable, "-c", PROBER, ip], lab.ns(name)),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert prober.stdout.readline().strip() == "ready"
            body = {"network_id": network, "name": name, "mac_address": vm_mac, "fixed_ips": [{"ip_address": vm_ip}],
                    "node": "c1", "interface_name": name, "project_id": "zp"}
            if i % 2 == 0:                        # the VIF first, then the API call
                lab.plug_vm("c1", name, vm_mac, "blue")
                port = api.post("/ports", json=body)
            else:                                 # the API call, then the VIF
                port = api.post("/ports", json=body)
                lab.plug_vm("c1", name, vm_mac, "blue")
            assert api.wait_status("ports", port["id"], "active", timeout=20)["status"] == "active"
            prober.stdin.write("go\n")
            prober.stdin.flush()
            answered.append((name, prober.stdout.readline().strip()))
        finally:
            for p in (booting, prober):
                p.kill()
                p.wait()
    api.close()
    assert all(got == "answered" for _, got in answered), answered
