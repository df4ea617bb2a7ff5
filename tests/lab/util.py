"""Fixtures for tests that build real labs. Every lab is torn down, even when a test fails."""
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from fathom.auth.client import lab_headers
from fathom.host import exec as host_exec
from fathom.lab.lab import Lab
from fathom.lab.ovs import OvsInstance
from fathom.lab.sh import run
from fathom.lab.topology import DEFAULT_TOPOLOGY, load, parse


@contextlib.contextmanager
def running_lab(name: str, topology_text: str | None = None, standalone: bool = True, controller: str | None = None,
                **up_options):
    lab = Lab(name)
    lab.down()  # a previous crashed run must not make this one fail
    topo = parse(topology_text, f"<{name}>") if topology_text else load(DEFAULT_TOPOLOGY)
    try:
        lab.up(topo, str(DEFAULT_TOPOLOGY) if topology_text is None else f"<{name}>", standalone=standalone,
               controller=controller, **up_options)
        yield lab
        assert_incremental_held(lab)
    finally:
        keep_logs(lab)
        lab.down()


LOGS = Path(os.environ.setdefault("FATHOM_LAB_KEEP_LOGS", "/tmp/fathom-lab-logs"))


def controller_log(lab: Lab, lines: int = 40) -> str:
    """The last lines of the lab controller's log, for an assertion's message."""
    log = lab.dir / "controller.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def keep_logs(lab: Lab) -> None:
    """The lab's logs (controller, agents, OVS) outlive it, in LOGS/<lab> (FATHOM_LAB_KEEP_LOGS:
    a lab that fails to come up keeps them there too)."""
    lab.keep_logs()


def assert_incremental_held(lab: Lab) -> None:
    """The lab's controller (run with FATHOM_CHECK_INCREMENTAL=1, tests/lab/conftest.py) compiled
    the model whole after every pass and found the incrementally kept desired state equal."""
    state = lab.state() or {}
    if not state.get("controller", {}).get("url") or state["controller"].get("managed") is False:
        return
    try:
        with lab_api(lab) as api:
            health = api.get("/health").json()
    except httpx.HTTPError:
        return   # a test that stopped the controller
    assert health.get("incremental_mismatches", 0) == 0, f"incremental != full compile: {health}"


def sh(lab: Lab, target: str, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    proc = lab.run(target, *cmd, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} in {target} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def listening(lab: Lab, vm: str, port: int, udp: bool = False) -> bool:
    """Whether a socket in the VM listens on `port` (TCP) or is bound to it (UDP)."""
    args = ["ss", "-Hn", "-lu" if udp else "-lt", f"sport = :{port}"]
    return bool(sh(lab, vm, *args, check=False).stdout.strip())


def wait_listening(lab: Lab, vm: str, port: int, udp: bool = False, timeout: float = 10) -> None:
    """Wait until the VM's server is up: a client started before it gets a reset, which would read
    as a filtered port."""
    deadline = time.monotonic() + timeout
    while not listening(lab, vm, port, udp):
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing listens on {vm}:{port} after {timeout} s")
        time.sleep(0.05)


def vm_namespace(lab: Lab, name: str, node: str, mac: str, ip: str, gateway: str | None = None) -> str:
    """A VM namespace wired like the lab wires its VMs: a veth whose node end is `name` in the
    node's namespace (not yet on br-int), TX checksum offload off on both ends (OVS reads a veth
    through AF_PACKET, before the checksum is filled in). Returns the namespace (the caller
    deletes it)."""
    ns, node_ns = lab.ns(name), lab.ns(node)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (["ip", "link", "add", name, "netns", node_ns, "type", "veth", "peer", "name", "eth0", "netns", ns],
                    ["ip", "-n", ns, "link", "set", "eth0", "address", mac],
                    ["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0"],
                    ["ip", "-n", ns, "link", "set", "eth0", "up"], ["ip", "-n", node_ns, "link", "set", name, "up"],
                    *([["ip", "-n", ns, "route", "add", "default", "via", gateway]] if gateway else []),
                    host_exec.argv(["ethtool", "-K", "eth0", "tx", "off"], ns),
                    host_exec.argv(["ethtool", "-K", name, "tx", "off"], node_ns)):
            subprocess.run(cmd, check=True, capture_output=True)
    except BaseException:
        subprocess.run(["ip", "netns", "del", ns])
        raise
    return ns


def ping(lab: Lab, src: str, dst_ip: str, count: int = 3) -> subprocess.CompletedProcess:
    # the first echo may be lost while ARP and the tunnel neighbour are learned
    return sh(lab, src, "ping", "-c", str(count), "-i", "0.2", "-W", "1", dst_ip, check=False)




def fabric_vlans(lab: Lab) -> dict[str, set[int]]:
    """A fabric switch port's name -> VLANs allowed in on it, read with ovs-ofctl (not through the controller)."""
    names = {}
    for line in sh(lab, "fabric", "ovs-ofctl", "-O", "OpenFlow14", "show", "br-fabric").stdout.splitlines():
        m = re.match(r"\s*(\d+)\((\S+)\):", line)
        if m:
            names[m.group(1)] = m.group(2)
    out = {n: set() for n in names.values()}
    flows = sh(lab, "fabric", "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", "br-fabric", "table=0").stdout
    for line in flows.splitlines():
        m = re.search(r"priority=100,in_port=(\d+),dl_vlan=(\d+)", line)
        if m:
            out[names[m.group(1)]].add(int(m.group(2)))
    return out


def lab_api(lab: Lab) -> httpx.Client:
    """An admin client of the lab's own controller (its token from the lab's state)."""
    state = lab.state()
    return httpx.Client(base_url=state["controller"]["url"] + "/v1", headers=lab_headers(state), timeout=30)


def await_status(c: httpx.Client, path: str, want: str = "active", timeout: float = 10) -> dict:
    """The object at `path` (e.g. "/routers/3") once its status is `want` within `timeout`, by the
    API's long-poll (`?wait=`, which also answers at an `error`: a passing one, e.g. a switch
    reconnecting, is waited out); fails with the object as it was when the time ran out."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(0.1, deadline - time.monotonic())
        got = c.get(path, params={"wait": want, "timeout": round(left, 1)}, timeout=left + 5).json()
        if got.get("status") == want or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    assert got.get("status") == want, got
    return got


def admit_web_from(client, ips, project: str = "demo") -> None:
    """Let TCP 80 from these addresses into the project's default security group (ingress only from
    members otherwise): the web traffic a NAT or a proxy VNF sends from its own address."""
    default = next(g for g in client.get("/security-groups") if g["project_id"] == project and g["name"] == "default")
    for ip in ips:
        client.post("/security-group-rules", json={
            "security_group_id": default["id"], "direction": "ingress", "ethertype": "IPv4", "protocol": "tcp",
            "port_range_min": 80, "port_range_max": 80, "remote_ip_prefix": f"{ip}/32"})


class BackgroundPing:
    """`ping -D -i <interval> -c N` from a VM in the background; ping's own summary counts the loss.
    Its output goes to a file: into a pipe nobody reads while the test waits, ping would block once
    the pipe's 64 KiB are full (about 15 s of replies at 20 ms) and stop sending."""

    def __init__(self, lab: Lab, src: str, dst: str, seconds: float, interval: float = 0.02):
        self.count = int(seconds / interval)
        argv, env = lab.exec_args(src, ["ping", "-D", "-n", "-i", str(interval), "-c", str(self.count), "-W", "1", dst])
        self.out = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.out, stderr=subprocess.STDOUT, text=True)
        self.what = f"{src} -> {dst}"

    def running(self) -> bool:
        return self.proc.poll() is None

    def _output(self, timeout: float) -> tuple[str, int, list[tuple[int, float]]]:
        """ping's output once it ended, its count of requests sent, (icmp_seq, wall-clock time) of
        every reply."""
        self.proc.wait(timeout)
        self.out.seek(0)
        out = self.out.read()
        m = re.search(r"(\d+) packets transmitted", out)
        assert m, f"ping {self.what}: no summary\n{out[-500:]}"
        replies = [(int(q), float(t)) for t, q in
                   re.findall(r"^\[(\d+\.\d+)\] \d+ bytes from .* icmp_seq=(\d+)", out, re.M)]
        return out, int(m.group(1)), replies

    def result(self, timeout: float = 120) -> tuple[int, int, list[float]]:
        """(transmitted, received, the wall-clock time of every reply), once ping sent its count."""
        out, sent, replies = self._output(timeout)
        return sent, int(re.search(r"(\d+) received", out).group(1)), [t for _, t in replies]

    def stop(self) -> tuple[int, list[tuple[int, float]]]:
        """Interrupt ping (it prints its summary): (transmitted, (icmp_seq, wall-clock time) of
        every reply)."""
        self.proc.send_signal(signal.SIGINT)
        _, sent, replies = self._output(10)
        return sent, replies


@contextlib.contextmanager
def ovs_in_namespace(name: str, rundir: Path):
    """An ovs-vswitchd and its database in a network namespace of their own (`name`, state in
    `rundir`), leftovers of an interrupted run removed first and everything removed at the end."""
    def clean() -> None:
        OvsInstance(name, rundir).stop()
        run(["ip", "netns", "del", name], check=False)
        shutil.rmtree(rundir, ignore_errors=True)

    clean()
    run(["ip", "netns", "add", name])
    run(["ip", "link", "set", "lo", "up"], ns=name)
    inst = OvsInstance(name, rundir)
    try:
        inst.start()
        yield inst
    finally:
        clean()


def live_watchers_end(lab: Lab, points=()) -> None:
    """After their idle time the live traces' watchers have detached every program and ended: no
    lt_in / lt_out program is loaded, no filter of theirs is left at the (node, interface) `points`."""
    from fathom.agent.livetrace import IDLE
    from fathom.lab.ovs import wait_for

    def loaded() -> str:
        return subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    wait_for(lambda: '"lt_in"' not in loaded() and '"lt_out"' not in loaded(), IDLE + 5, "the watchers detached")
    for node, dev in points:
        for hook in ("ingress", "egress"):
            assert "lt_" not in sh(lab, node, "tc", "filter", "show", "dev", dev, hook).stdout, (node, dev, hook)


def unplugged_vm(lab, name: str, node: str, mac: str, ip: str) -> None:
    """A VM namespace (`lab.ns(name)`) with address `ip`/24 and `mac` on a veth whose other end,
    named `name`, waits in `node`'s namespace, not on br-int yet (its VIF not plugged)."""
    vns, node_ns = lab.ns(name), lab.ns(node)
    run(["ip", "netns", "add", vns])
    run(["ip", "link", "set", "lo", "up"], ns=vns)
    run(["ip", "link", "add", name, "netns", node_ns, "type", "veth", "peer", "name", "eth0", "netns", vns])
    run(["ip", "link", "set", "eth0", "address", mac], ns=vns)
    run(["ip", "addr", "add", f"{ip}/24", "dev", "eth0"], ns=vns)
    for ns, dev in ((vns, "eth0"), (node_ns, name)):
        run(["ethtool", "-K", dev, "tx", "off"], ns=ns)
        run(["ip", "link", "set", dev, "up"], ns=ns)
