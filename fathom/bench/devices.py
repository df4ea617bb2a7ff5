"""Devices under test for `fathom bench switch`, each built in namespaces <prefix>-gen, -dut, -rcv
(prefix `sb` unless the command is given --prefix, so that two runs on one machine do not collide).

    veth         sb-gen:g0 <-> sb-rcv:r0                    the loopback calibration (no device)
    redirect     sb-gen:g0 <-> sb-dut:dg0 [tc mirred: dg0 ingress -> dr0 egress] sb-dut:dr0 <-> sb-rcv:r0
                 a device that does nothing but receive and send: the floor with a receive path
    linuxbridge  sb-gen:g0 <-> sb-dut:dg0 [bridge sbbr] sb-dut:dr0 <-> sb-rcv:r0
    ovs          same, with an Open vSwitch netdev bridge `sbbr` (fail_mode=secure) whose controller is
                 the benchmark's own os-ken agent, listening on 127.0.0.1:6653 inside sb-dut

Everything is removed by `cleanup()` (by the namespaces' names), also after a crash.
"""
from __future__ import annotations

import json
import re
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fathom.host.exec import argv
from fathom.lab.ovs import OvsInstance, kill_and_wait
from fathom.lab.sh import run

from .engine import BenchError, Port

RUNDIR = Path("/run/fathom-bench")
OF_PORT = 6653
GEN_PORT, RCV_PORT = 1, 2  # OpenFlow port numbers of dg0 and dr0 on the OVS bridge
DEVICES = ("veth", "redirect", "linuxbridge", "ovs")
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,7}$")


@dataclass(frozen=True)
class Names:
    """The namespaces and run directory of one benchmark run."""
    prefix: str = "sb"

    def __post_init__(self):
        if not PREFIX_RE.match(self.prefix):
            raise BenchError(f"--prefix {self.prefix!r}: 2-8 lowercase letters or digits, starting with a letter")

    @property
    def gen(self) -> str:
        return f"{self.prefix}-gen"

    @property
    def dut(self) -> str:
        return f"{self.prefix}-dut"

    @property
    def rcv(self) -> str:
        return f"{self.prefix}-rcv"

    @property
    def rundir(self) -> Path:
        return RUNDIR / self.dut


def _netns_list() -> list[str]:
    out = run(["ip", "-j", "netns", "list"], check=False).stdout.strip()
    return [e["name"] for e in json.loads(out)] if out else []


def cleanup(names: Names = Names()) -> list[str]:
    """Remove the namespaces and processes of one benchmark run (its three namespaces, its run dir)."""
    removed = []
    for ns in _netns_list():
        if ns in (names.gen, names.dut, names.rcv):
            for pid in run(["ip", "netns", "pids", ns], check=False).stdout.split():
                kill_and_wait(int(pid), timeout=3)
            run(["ip", "netns", "del", ns], check=False)
            removed.append(ns)
    if names.rundir.exists():
        for pidfile in names.rundir.glob("**/*.pid"):
            try:
                pid = int(pidfile.read_text().strip())
                if str(names.rundir) in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "):
                    kill_and_wait(pid, timeout=3)
            except (OSError, ValueError):
                pass
        subprocess.run(["rm", "-rf", str(names.rundir)], check=False)
    return removed


def _mac(ns: str, dev: str) -> str:
    return json.loads(run(["ip", "-j", "link", "show", dev], ns=ns).stdout)[0]["address"]


def _veth(ns_a: str, a: str, ns_b: str, b: str, mtu: int) -> None:
    run(["ip", "link", "add", a, "netns", ns_a, "mtu", str(mtu), "type", "veth", "peer", "name", b,
         "netns", ns_b, "mtu", str(mtu)])
    for ns, dev in ((ns_a, a), (ns_b, b)):
        # AF_PACKET readers (OVS netdev) see packets before checksums are filled in
        run(["ethtool", "-K", dev, "tx", "off"], ns=ns, check=False)
        run(["ip", "link", "set", dev, "up"], ns=ns)


class Device:
    name = "?"
    openflow = False

    def __init__(self, mtu: int = 1500, names: Names = Names()):
        self.mtu, self.names = mtu, names
        self.tx = Port(names.gen, "g0")
        self.rx = Port(names.rcv, "r0")

    @property
    def max_frame(self) -> int:
        return self.mtu + 18

    def setup(self) -> None:
        cleanup(self.names)
        n = self.names
        for ns in (n.gen, n.rcv) + ((n.dut,) if self.name != "veth" else ()):
            run(["ip", "netns", "add", ns])
            run(["ip", "link", "set", "lo", "up"], ns=ns)
            # no IPv6 on the test links: router/neighbour solicitations would be frames the device
            # forwards (and counts) besides the probes
            for key in ("all", "default"):
                run(["sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"], ns=ns, check=False)
        self._build()
        self.tx.mac = _mac(n.gen, "g0")
        self.rx.mac = _mac(n.rcv, "r0")

    def _build(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        cleanup(self.names)

    def describe(self) -> dict:
        return {"device": self.name, "mtu": self.mtu, "max_frame_bytes": self.max_frame,
                "tx": f"{self.tx.ns}:{self.tx.ifname}", "rx": f"{self.rx.ns}:{self.rx.ifname}"}

    def offloads(self) -> dict:
        out = {}
        for port in (self.tx, self.rx):
            txt = run(["ethtool", "-k", port.ifname], ns=port.ns, check=False).stdout
            out[f"{port.ns}:{port.ifname}"] = {l.split(":")[0].strip(): l.split(":")[1].split()[0]
                                                for l in txt.splitlines()[1:] if ":" in l and "fixed" not in l
                                                and l.split(":")[1].strip()}
        return out

    def drop_every(self, n: int) -> None:
        """Self-test impairment: the device drops every n-th frame it forwards (nftables numgen)."""
        raise BenchError(f"--drop-every is not available on device {self.name}")

    def clear_impairments(self) -> None:
        pass


class VethDevice(Device):
    name = "veth"

    def _build(self) -> None:
        _veth(self.names.gen, "g0", self.names.rcv, "r0", self.mtu)


class RedirectDevice(Device):
    """No switching at all: tc mirred sends every frame arriving on dg0 out of dr0. A frame crosses two
    veths and dg0's whole receive path (backlog queue, softirq, up to tc ingress), so this is the floor
    for devices that receive frames, which the direct veth (both stamps in one veth_xmit) is not."""
    name = "redirect"

    def _build(self) -> None:
        dut = self.names.dut
        _veth(self.names.gen, "g0", dut, "dg0", self.mtu)
        _veth(dut, "dr0", self.names.rcv, "r0", self.mtu)
        run(["tc", "qdisc", "add", "dev", "dg0", "ingress"], ns=dut)
        run(["tc", "filter", "add", "dev", "dg0", "parent", "ffff:", "protocol", "all", "u32", "match", "u32", "0",
             "0", "action", "mirred", "egress", "redirect", "dev", "dr0"], ns=dut)


class LinuxBridgeDevice(Device):
    name = "linuxbridge"

    def _build(self) -> None:
        dut = self.names.dut
        _veth(self.names.gen, "g0", dut, "dg0", self.mtu)
        _veth(dut, "dr0", self.names.rcv, "r0", self.mtu)
        run(["ip", "link", "add", "sbbr", "type", "bridge", "stp_state", "0", "forward_delay", "0"], ns=dut)
        run(["ip", "link", "set", "sbbr", "mtu", str(self.mtu)], ns=dut)
        for dev in ("dg0", "dr0"):
            run(["ip", "link", "set", dev, "master", "sbbr"], ns=dut)
        run(["ip", "link", "set", "sbbr", "up"], ns=dut)

    def setup(self) -> None:
        super().setup()
        # the receiver's MAC is known to the bridge: unicast frames are forwarded, not flooded
        run(["bridge", "fdb", "replace", self.rx.mac, "dev", "dr0", "master", "static"], ns=self.names.dut)

    def drop_every(self, n: int) -> None:
        rules = (f"table bridge sbimp {{\n chain sbfwd {{\n  type filter hook forward priority 0; policy accept;\n"
                 f"  numgen inc mod {n} == {n - 1} counter drop\n }}\n}}\n")
        run(["nft", "-f", "-"], ns=self.names.dut, input=rules)

    def clear_impairments(self) -> None:
        run(["nft", "delete", "table", "bridge", "sbimp"], ns=self.names.dut, check=False)


class OvsDevice(Device):
    name = "ovs"
    openflow = True

    def __init__(self, mtu: int = 1500, names: Names = Names()):
        super().__init__(mtu, names)
        self.ovs = OvsInstance(names.dut, names.rundir)
        self.agent: subprocess.Popen | None = None
        self.version = "?"

    def _build(self) -> None:
        _veth(self.names.gen, "g0", self.names.dut, "dg0", self.mtu)
        _veth(self.names.dut, "dr0", self.names.rcv, "r0", self.mtu)
        self.ovs.start()
        self.version = run(["ovs-vswitchd", "--version"]).stdout.split()[-1]
        self._start_agent()
        self.ovs.vsctl("add-br", "sbbr", "--", "set", "bridge", "sbbr", "datapath_type=netdev",
                       "fail_mode=secure", "other_config:disable-in-band=true",
                       "protocols=OpenFlow13,OpenFlow14",
                       "--", "add-port", "sbbr", "dg0", "--", "set", "interface", "dg0", f"ofport_request={GEN_PORT}",
                       "--", "add-port", "sbbr", "dr0", "--", "set", "interface", "dr0", f"ofport_request={RCV_PORT}",
                       "--", "set-controller", "sbbr", f"tcp:127.0.0.1:{OF_PORT}")
        self.ovs.vsctl("set", "controller", "sbbr", "inactivity_probe=0", check=False)
        info = self.of({"op": "wait", "timeout": 20})
        self.of_version = info["version"]
        self.of({"op": "clear"})

    def _start_agent(self) -> None:
        log = self.names.rundir / "ofagent.log"
        self.agent = subprocess.Popen(
            argv([sys.executable, "-m", "fathom.bench.ofagent", "--port", str(OF_PORT), "--log", str(log)],
                 self.names.dut), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1)
        (self.names.rundir / "ofagent.pid").write_text(str(self.agent.pid))

    def of(self, cmd: dict, timeout: float = 60) -> dict:
        """One command to the OpenFlow agent; its answer, or BenchError."""
        if not self.agent or self.agent.poll() is not None:
            err = self.agent.stderr.read() if self.agent else ""
            raise BenchError(f"the OpenFlow agent is not running: {err.strip()[-500:]}")
        self.agent.stdin.write(json.dumps(cmd) + "\n")
        self.agent.stdin.flush()
        ready, _, _ = select.select([self.agent.stdout], [], [], timeout)
        if not ready:
            raise BenchError(f"the OpenFlow agent did not answer {cmd['op']} in {timeout}s")
        line = self.agent.stdout.readline()
        if not line:
            raise BenchError(f"the OpenFlow agent exited: {self.agent.stderr.read().strip()[-500:]}")
        res = json.loads(line)
        if not res.get("ok"):
            raise BenchError(f"OpenFlow {cmd['op']}: {res.get('error')}")
        return res

    def flows(self, flows: list[dict], barrier: bool = True, gap_s: float = 0) -> dict:
        return self.of({"op": "flows", "flows": flows, "barrier": barrier, "gap_s": gap_s})

    def forward(self, actions: list | None = None, match: dict | None = None, priority: int = 100) -> dict:
        self.of({"op": "clear"})
        return self.flows([{"priority": priority, "match": {"in_port": GEN_PORT, **(match or {})},
                            "actions": (actions or []) + [["output", RCV_PORT]]}])

    def dump_flows(self) -> str:
        return self.ovs.ofctl("dump-flows", "sbbr", check=False)

    def port_stats(self) -> str:
        return self.ovs.ofctl("dump-ports", "sbbr", check=False)

    def describe(self) -> dict:
        return {**super().describe(), "ovs_version": self.version, "datapath": "netdev (userspace)",
                "openflow_version": getattr(self, "of_version", None)}

    def drop_every(self, n: int) -> None:
        # OVS transmits on dr0 through an AF_PACKET socket without qdisc bypass: the netdev egress hook sees it
        rules = (f"table netdev sbimp {{\n chain sbout {{\n  type filter hook egress device \"dr0\" priority 0; "
                 f"policy accept;\n  numgen inc mod {n} == {n - 1} counter drop\n }}\n}}\n")
        run(["nft", "-f", "-"], ns=self.names.dut, input=rules)

    def clear_impairments(self) -> None:
        run(["nft", "delete", "table", "netdev", "sbimp"], ns=self.names.dut, check=False)

    def teardown(self) -> None:
        if self.agent and self.agent.poll() is None:
            try:
                self.agent.stdin.write('{"op": "quit"}\n')
                self.agent.stdin.flush()
                self.agent.wait(3)
            except Exception:
                self.agent.kill()
        try:
            self.ovs.stop()
        finally:
            super().teardown()


def make_device(name: str, mtu: int = 1500, names: Names = Names()) -> Device:
    classes = {"veth": VethDevice, "redirect": RedirectDevice, "linuxbridge": LinuxBridgeDevice, "ovs": OvsDevice}
    if name not in classes:
        raise BenchError(f"unknown device {name!r}: choose from {', '.join(DEVICES)}")
    if not 576 <= mtu <= 9000:
        raise BenchError(f"--mtu {mtu}: must be 576..9000")
    return classes[name](mtu, names)
