"""The emulated cloud, standalone (no controller): NORMAL switching and a VXLAN underlay."""
import json
import os
import signal
import subprocess

import pytest

from fathom.host.iperf import iperf3
from fathom.lab.capture import Capture
from fathom.lab.lab import Lab, RUN_ROOT
from fathom.lab.ovs import wait_for
from fathom.lab.sh import LabError
from fathom.lab.topology import DEFAULT_TOPOLOGY, load

from .util import ping, running_lab, sh

VM_IP = {"vm1": "198.19.1.11", "vm2": "198.19.1.12", "vm3": "198.19.1.13", "vm4": "198.19.1.14"}


def test_same_node_ping(standalone_lab):
    out = ping(standalone_lab, "vm1", VM_IP["vm2"])
    assert out.returncode == 0, out.stdout
    assert " 0% packet loss" in out.stdout


def test_cross_node_ping_is_vxlan_on_the_underlay(standalone_lab, tmp_path):
    lab = standalone_lab
    pcap = tmp_path / "ul.pcap"
    # witness on the fabric's port toward compute1: UDP 4789 carrying VNI 1001
    with Capture(lab.ns("fabric"), "compute1", pcap, "udp port 4789") as cap:
        out = ping(lab, "vm1", VM_IP["vm3"], count=5)
        assert out.returncode == 0, out.stdout
    rows = set(cap.fields("vxlan.vni", "ip.src", "ip.dst", "icmp.type", display="vxlan && icmp"))
    c1, c2 = lab.node("compute1").tunnel_ip, lab.node("compute2").tunnel_ip
    # outer (tunnel endpoints) and inner (VM) addresses, echo request and reply
    assert ("1001", f"{c1},198.19.1.11", f"{c2},198.19.1.13", "8") in rows, rows
    assert ("1001", f"{c2},198.19.1.13", f"{c1},198.19.1.11", "0") in rows, rows


def test_tunnel_neighbour_table_learned_by_arp(standalone_lab):
    lab = standalone_lab
    ping(lab, "vm1", VM_IP["vm3"])
    peer = lab.node("compute2")
    peer_mac = json.loads(sh(lab, "compute2", "ip", "-j", "link", "show", "br-phy").stdout)[0]["address"]
    neigh = sh(lab, "compute1", "ovs-appctl", "tnl/neigh/show").stdout
    assert any(peer.tunnel_ip in line and peer_mac in line for line in neigh.splitlines()), neigh


def test_tcp_across_nodes(standalone_lab):
    lab = standalone_lab
    assert iperf3(lab.ns("vm2"), lab.ns("vm4"), VM_IP["vm4"], seconds=2).bytes > 1_000_000


def test_status_reports_nodes_bridges_and_vms(standalone_lab):
    st = standalone_lab.status()
    nodes = {n["name"]: n for n in st["nodes"]}
    assert set(nodes) == {"compute1", "compute2", "gw", "fabric"}
    for n in nodes.values():
        assert n["ovsdb_server"] and n["ovs_vswitchd"] and n["ovs_version"].startswith("3.")
    assert {"br-int", "br-phy"} <= set(nodes["compute1"]["bridges"])
    assert {"vm1", "vm2"} <= set(nodes["compute1"]["bridges"]["br-int"])
    assert "ul0" in nodes["compute1"]["bridges"]["br-phy"]
    assert sorted(v["name"] for v in st["vms"] if v["link_up"]) == ["vm1", "vm2", "vm3", "vm4"]


def test_cli_status_json_and_list(standalone_lab):
    fathom = [os.path.join(os.path.dirname(os.sys.executable), "fathom")]
    st = json.loads(subprocess.run(fathom + ["lab", "status", "-n", "t2s", "--json"], capture_output=True,
                                   text=True, check=True).stdout)
    assert st["name"] == "t2s" and len(st["vms"]) == 4
    labs = json.loads(subprocess.run(fathom + ["lab", "list", "--json"], capture_output=True, text=True,
                                     check=True).stdout)
    assert any(l["name"] == "t2s" and l["status"] == "up" for l in labs)


def test_up_on_existing_lab_is_a_clear_error(standalone_lab):
    with pytest.raises(LabError, match="already exists"):
        standalone_lab.up(load(DEFAULT_TOPOLOGY), "again", standalone=True)
    assert ping(standalone_lab, "vm1", VM_IP["vm2"]).returncode == 0  # and nothing was disturbed


def _leftovers(name: str) -> list[str]:
    found = [f"netns {n}" for n in Lab(name).namespaces()]
    found += [f"link {l}" for l in Lab(name).root_links()]
    procs = subprocess.run(["pgrep", "-af", str(RUN_ROOT / name) + "/"], capture_output=True, text=True).stdout
    found += [f"process {p}" for p in procs.splitlines()]
    if (RUN_ROOT / name).exists():
        found.append("run dir")
    return found


def test_down_after_a_node_crash_removes_everything():
    with running_lab("t2k") as lab:
        # the whole host goes: its supervisor, then its switch (left alone, its database lingers)
        ovs = lab.ovs("compute1")
        os.kill(int((ovs.rundir / "supervisor.pid").read_text()), signal.SIGKILL)
        os.kill(ovs.pid("ovs-vswitchd"), signal.SIGKILL)
        wait_for(lambda: lab.status()["nodes"][0]["ovs_vswitchd"] is False, 5, "status to show the crash")
        assert lab.status()["nodes"][0]["supervisor"]["running"] is False
        lab.down()
        assert _leftovers("t2k") == []


def test_two_labs_at_once(standalone_lab):
    with running_lab("t2b") as other:
        assert other.state()["management"]["cidr"] != standalone_lab.state()["management"]["cidr"]
        assert ping(other, "vm1", VM_IP["vm3"]).returncode == 0
        assert ping(standalone_lab, "vm1", VM_IP["vm3"]).returncode == 0
    assert _leftovers("t2b") == []
    assert ping(standalone_lab, "vm2", VM_IP["vm4"]).returncode == 0


def test_cli_errors_name_what_to_run(tmp_path):
    fathom = os.path.join(os.path.dirname(os.sys.executable), "fathom")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes:\n  - name: c1\n    colour: red\n")
    out = subprocess.run([fathom, "lab", "up", "-n", "t2e", "-t", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2 and f"{bad}:3: nodes[0].colour: unknown key" in out.stderr
    assert _leftovers("t2e") == []
    out = subprocess.run([fathom, "lab", "up", "-n", "t2e"], capture_output=True, text=True,
                         env={**os.environ, "PATH": "/nonexistent"})
    assert out.returncode == 1 and "run 'sudo scripts/setup'" in out.stderr
    assert _leftovers("t2e") == []
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", fathom, "lab", "up",
                          "-n", "t2e"], capture_output=True, text=True)
    assert out.returncode == 1 and "needs root" in out.stderr, out.stderr
