"""Specs against a real Open vSwitch: OVS accepts every flow and group the tenant compiler emits, and
`to_ofctl()` is exactly what `ovs-ofctl --no-stats dump-flows` prints back.

The switch is an ovs-vswitchd with the dummy datapath (`--enable-dummy=override`): no kernel
devices, no namespaces, no root; everything lives in a temp dir and goes with the test.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from fathom.openflow.spec import (
    OFPP_IN_PORT, OFPP_LOCAL, Controller, Ct, CtClear, DecTtl, FlowSpec, GotoTable, GroupSpec, LoadReg, Move, Nat, Output,
    Resubmit, SetField,
)
from fathom.pipeline import stages as st
from .flowsim import compile_tenant

from .test_compiler_tenant import cloud

SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")


class Ovs:
    def __init__(self, base: Path):
        self.base = base
        self.env = {**os.environ, "OVS_RUNDIR": str(base), "OVS_LOGDIR": str(base),
                    "OVS_DBDIR": str(base)}
        self.db = f"unix:{base}/db.sock"
        self.procs: list[subprocess.Popen] = []

    def run(self, *cmd: str) -> str:
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=30)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)}: {done.stderr.strip()}")
        return done.stdout

    def start(self) -> "Ovs":
        self.run("ovsdb-tool", "create", str(self.base / "conf.db"), str(SCHEMA))
        self.procs.append(subprocess.Popen(
            ["ovsdb-server", str(self.base / "conf.db"), f"--remote=p{self.db}",
             f"--log-file={self.base}/ovsdb.log"], env=self.env))
        self._wait(self.base / "db.sock")
        self.run("ovs-vsctl", f"--db={self.db}", "--no-wait", "init")
        self.procs.append(subprocess.Popen(
            ["ovs-vswitchd", "--enable-dummy=override", self.db, f"--pidfile={self.base}/ovs-vswitchd.pid",
             f"--log-file={self.base}/vswitchd.log"], env=self.env))
        return self

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
            p.wait(timeout=10)

    def _wait(self, path: Path) -> None:
        for _ in range(100):
            if path.exists():
                return
            time.sleep(0.05)
        raise AssertionError(f"{path} never appeared")

    def vsctl(self, *args: str) -> None:
        self.run("ovs-vsctl", f"--db={self.db}", "--timeout=10", *args)

    def bridge(self, name: str, ofports: dict[str, int]) -> str:
        """A br-int-like bridge with the given ports; the ovs-ofctl target for it."""
        self.vsctl("add-br", name, "--", "set", "bridge", name, "datapath_type=dummy",
                   "fail-mode=secure", "protocols=OpenFlow13")
        for iface, ofport in ofports.items():
            # Port names are unique per OVS instance: prefix them with the bridge's name.
            extra = ["type=vxlan", "options:remote_ip=flow", "options:key=flow"] if iface == "vxlan0" else []
            port = f"{name}-{iface}"
            self.vsctl("add-port", name, port, "--", "set", "interface", port,
                       f"ofport_request={ofport}", *extra)
        target = f"unix:{self.base}/{name}.mgmt"
        self._wait(self.base / f"{name}.mgmt")
        return target

    def ofctl(self, *args: str) -> str:
        return self.run("ovs-ofctl", "-O", "OpenFlow13", *args)


@pytest.fixture(scope="module")
def ovs(tmp_path_factory):
    for tool in ("ovsdb-server", "ovs-vswitchd", "ovs-ofctl", "ovs-vsctl", "ovsdb-tool"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: run scripts/setup (Debian package openvswitch-switch)")
    switch = Ovs(tmp_path_factory.mktemp("ovs")).start()
    yield switch
    switch.stop()


def _install(ovs: Ovs, target: str, flows, groups, tmp_path: Path) -> None:
    (tmp_path / "groups.txt").write_text("".join(g.to_ofctl() + "\n" for g in groups))
    (tmp_path / "flows.txt").write_text("".join(f.to_ofctl() + "\n" for f in flows))
    if groups:
        ovs.ofctl("add-groups", target, str(tmp_path / "groups.txt"))
    ovs.ofctl("add-flows", target, str(tmp_path / "flows.txt"))


def _dumped_flows(ovs: Ovs, target: str) -> list[str]:
    return sorted(line.strip() for line in ovs.ofctl("--no-stats", "dump-flows", target).splitlines()
                  if "priority=" in line)


def _dumped_groups(ovs: Ovs, target: str) -> list[str]:
    return sorted(line.strip() for line in ovs.ofctl("dump-groups", target).splitlines()
                  if "group_id=" in line)


@pytest.mark.parametrize("node", ["c1", "c2", "c3"])
def test_ovs_accepts_compiled_flows_and_prints_them_as_we_do(ovs, node, tmp_path):
    snap = cloud()
    state = compile_tenant(snap)[node]
    ofports = next(n for n in snap.nodes if n.name == node).ofports
    target = ovs.bridge(f"br{node}", dict(ofports))
    _install(ovs, target, state.flows, state.groups, tmp_path)
    assert _dumped_flows(ovs, target) == sorted(f.to_ofctl() for f in state.flows)
    assert _dumped_groups(ovs, target) == sorted(g.to_ofctl() for g in state.groups)


def test_trace_follows_the_documented_stages(ovs, tmp_path):
    snap = cloud()
    state = compile_tenant(snap)["c1"]
    ofports = next(n for n in snap.nodes if n.name == "c1").ofports
    target = ovs.bridge("brtrace", dict(ofports))
    _install(ovs, target, state.flows, state.groups, tmp_path)
    # tap101 (blue, c1) to tap102's MAC (blue, on c2): out of the tunnel with blue's VNI.
    trace = ovs.run("ovs-appctl", "-t", _vswitchd_ctl(ovs), "ofproto/trace", "brtrace",
                    f"in_port={ofports['tap101']},dl_src=02:00:00:00:01:01,dl_dst=02:00:00:00:01:02,"
                    "ip,nw_src=10.0.0.11,nw_dst=10.0.0.12,nw_ttl=64")
    tables = [int(m.group(1)) for m in re.finditer(r"^\s*(\d+)\. ", trace, re.MULTILINE)]
    assert tables == [st.CLASSIFY, st.TAP_INGRESS, st.SECURITY, st.ARP, st.EGRESS_CONNTRACK, st.SFC, st.L3,
                      st.L2, st.TAP_EGRESS, st.TAP_RECOVERY, st.INGRESS_CONNTRACK, st.OUTPUT]
    assert "set_field:0x3e9->tun_id" in trace and "set_field:198.18.0.2->tun_dst" in trace
    assert f"output:{ofports['vxlan0']}" in trace


def _vswitchd_ctl(ovs: Ovs) -> str:
    (ctl,) = ovs.base.glob("ovs-vswitchd.*.ctl")
    return str(ctl)


def test_every_action_renders_as_ovs_prints_it(ovs, tmp_path):
    target = ovs.bridge("bractions", {"tap1": 20, "tap2": 21})
    c = st.cookie(st.APP_TENANT, st.KIND_PORT, 1)
    flows = {
        FlowSpec(90, 1, {"eth_type": 0x0800, "reg1": 5},
                 (LoadReg("reg2", 7, 0, 16), LoadReg("reg3", 9), Resubmit(91), Resubmit(91, 20)), c),
        FlowSpec(90, 2, {"eth_type": 0x0800, "metadata": 5, "ipv4_src": ("10.0.0.0", "255.0.0.0")},
                 (Move("reg1", "reg2", 8, 0, 8), DecTtl(), Controller(128), Output(OFPP_LOCAL)), c),
        FlowSpec(90, 3, {"eth_type": 0x0806, "arp_op": 1},
                 (Move("arp_spa", "arp_tpa", 32), SetField("arp_op", 2), Output(OFPP_IN_PORT)), c),
        FlowSpec(90, 4, {"eth_dst": ("01:00:00:00:00:00", "01:00:00:00:00:00"), "reg3": (5, 0xff)},
                 (Controller(), Output(21)), c),
        FlowSpec(90, 5, {"eth_type": 0x0800, "ip_proto": 6, "tcp_dst": 80}, (), c),
        FlowSpec(90, 6, {"in_port": 20, "vlan_vid": 0}, (), c),
        FlowSpec(90, 7, {"in_port": 20}, (SetField("tunnel_id", 5),), 0),
    }
    groups = {GroupSpec(7, "select", ((Output(20),), (Output(21),))),
              GroupSpec(8, "indirect", ((SetField("eth_dst", "02:00:00:00:00:01"), Output(20)),))}
    _install(ovs, target, flows, groups, tmp_path)
    assert _dumped_flows(ovs, target) == sorted(f.to_ofctl() for f in flows)
    # Select buckets carry their weight in the dump; compare the rest.
    dumped = [g.replace(",weight:100", "").replace("bucket=weight:100,", "bucket=")
              for g in _dumped_groups(ovs, target)]
    assert dumped == sorted(g.to_ofctl() for g in groups)


def test_conntrack_actions_render_as_ovs_prints_them(ovs, tmp_path):
    """The one ct action in its uses: the external app's nat with an immediate zone, security groups' zone
    from a register with exec(ct_mark), and both at once; the ct_zone match. On a switch that really
    has conntrack."""
    target = ovs.bridge("brct", {"tap1": 20})
    c = st.cookie(st.APP_TENANT, st.KIND_PORT, 1)
    flows = {
        FlowSpec(46, 1, {"eth_type": 0x0800, "reg6": 3, "ipv4_dst": "203.0.113.5"},
                 (Ct(32769, commit=True, table=48, nat=Nat("dst", "10.0.0.5")),), c),
        FlowSpec(46, 2, {"eth_type": 0x0800, "ipv4_dst": "203.0.113.2"}, (Ct(32768, table=48, nat=Nat()),), c),
        FlowSpec(48, 3, {"ct_zone": 32768, "eth_type": 0x0800, "reg6": 3, "ipv4_dst": ("10.0.0.0", "255.255.255.0")},
                 (DecTtl(), SetField("reg6", 4)), c),
        FlowSpec(57, 4, {"eth_type": 0x0800, "reg6": 4, "ipv4_src": "10.0.0.5"},
                 (SetField("reg6", 3), Ct(32769, commit=True, nat=Nat("src", "203.0.113.5")), GotoTable(60)), c),
        FlowSpec(72, 5, {"eth_type": 0x0800, "reg7": 20},
                 (CtClear(), SetField("reg11", 7), Ct(zone_field="reg11", table=75)), c),
        FlowSpec(75, 6, {"eth_type": 0x0800, "reg11": 7},
                 (Ct(zone_field="reg11", commit=True, nat=Nat("src", "203.0.113.6"),
                     exec=(SetField("ct_mark", 9),)), GotoTable(80)), c),
    }
    _install(ovs, target, flows, (), tmp_path)
    assert _dumped_flows(ovs, target) == sorted(f.to_ofctl() for f in flows)
