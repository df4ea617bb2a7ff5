"""`fathom bench ovn-compare`: the same lab shape under fathom and under OVN 23.03, side by side.

Two labs are up at once, built by the same lab code (fathom/bench/topologies/ovn-compare.yaml: nodes
c1, c2, gw; one tenant with subnets blue and green joined by a distributed router r1; VMs a1, b1 on
c1 and a2, b2 on c2). VMs and ports are plugged the same way in both (Lab.add_vm / Lab.plug_vm: a veth
whose node end becomes a br-int port with `external_ids:iface-id`). Under fathom the lab runs its own
controller (plain TCP on OpenFlow and OVSDB, as OVN's databases here) with VXLAN networks; under OVN
the lab is built without a controller and fathom.bench.ovn starts NB/SB databases, northd and one
ovn-controller per node (Geneve). In both, every VM port is in the project's default security group
(fathom's own; OVN's as Neutron's OVN driver writes it: fathom.bench.ovn), so both pass the VMs'
traffic through conntrack (`conntrack` in the results counts one VM's connections). Each measurement
alternates between the systems (and which goes first), so drift on this shared machine hits both.

Figures, per system:
- TCP throughput (iperf3) a1 -> a2 (same subnet) and a1 -> b2 (routed), both across nodes;
- port-up latency: from the moment a port exists in both senses (the later of "API call issued" and
  "VIF plug issued", i.e. `ovs-vsctl add-port` started) to (a) the system reporting it up and (b) the first echo reply of a 2 ms ping from the
  new VM to a2 on the other node (static neighbours on both ends), in three plug orders, at two tenant
  sizes; and (b) − (a), how long after the system says up the port first forwards (the ping runs
  from before the port exists, as a booting VM sends before its port is up); each measured port is
  removed again, so the tenant size stays fixed;
- ports reported up before their VIF existed (the orders that plug after the API call);
- control-plane CPU (utime + stime) for a batch of ports to all-up and over a fixed window, and at
  rest (after SETTLE_S); the nodes' ovs-vswitchd/ovsdb-server separately; control-plane RSS; OpenFlow
  flows per node.

The tenant grows in one of two shapes (SHAPES): its extra ports alternate between the two networks
(`two-networks`), or all join blue (`one-network`: every port of the tenant in one network and one
security group, so each new port's address is a remote-group member on every node and each node
floods blue's broadcasts to ~50 local ports).

With `--replicas N` (ClusterBench) OVN stays out: fathom with one controller against fathom with N
controller replicas, both on one PostgreSQL, port API call -> `active` and -> first echo.
"""
from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path

from fathom.auth.client import lab_token
from fathom.client import ApiError, Client
from fathom.host.exec import argv
from fathom.host.iperf import iperf3

from fathom.bench import procs
from fathom.bench.ovn import Ovn, UpMonitor
from fathom.bench.report import dist, environment, machine_activity
from fathom.lab.lab import Lab
from fathom.lab.sh import LabError, run
from fathom.lab.topology import Topology, load
from fathom.model import datapath_id

TOPOLOGY = Path(__file__).parent / "topologies" / "ovn-compare.yaml"
SYSTEMS = ("fathom", "ovn")
SHAPES = {"two-networks": "extra ports alternate between blue and green",
          "one-network": "every extra port in blue (one network, one security group)"}
ORDERS = {
    "plug_first": "VIF plugged, then the API call",
    "api_then_plug": "API call, then the VIF plugged at once",
    "api_plug_500ms": "API call, VIF plugged 0.5 s later (OpenStack's order)",
}
PATHS = {"same_subnet": ("a1", "a2"), "routed": ("a1", "b2")}
PROBE_TARGET = "a2"           # the measured port's VM pings this VM on the other node
ROUTER_MACS = {"blue": "02:0c:ff:00:00:01", "green": "02:0c:ff:00:00:02"}
UP_TIMEOUT_S = 20.0
# Before an at-rest window both systems are left alone this long, so the window holds no tail of the
# work before it (fathom's controller collects and freezes its memory up to FREEZE_EVERY = 5 s after
# its last pass: fathom.controller.reconciler).
SETTLE_S = 10.0


class System:
    """What the benchmark needs of a system under test; `lab` is its lab."""
    name: str
    lab: Lab
    topo: Topology

    def up(self, progress) -> None:
        """Build the lab with the tenant and its VMs, every VM port up."""
        raise NotImplementedError

    def create_port(self, name: str, mac: str, ip: str, network: str, node: str):
        """The API call creating a VM port (the VIF is plugged apart); returns what wait_up and
        delete_port take."""
        raise NotImplementedError

    def wait_up(self, handle, timeout: float) -> float | None:
        """time.time() at which the system reported the port up, None if not within timeout s."""
        raise NotImplementedError

    def delete_port(self, handle) -> None:
        raise NotImplementedError

    def note(self, handle) -> dict:
        """What a port's record notes of the system beyond its times (read after it is up)."""
        return {}

    def control_plane(self) -> dict[str, int]:
        """The control plane's processes: name -> pid."""
        raise NotImplementedError

    def down(self) -> None:
        self.lab.down()

    def node_ovs(self) -> dict[str, int]:
        """The nodes' own OVS daemons (not the control plane): '<node> <daemon>' -> pid."""
        out = {}
        for node in self.lab.nodes():
            ovs = self.lab.ovs(node.name)
            for d in ("ovs-vswitchd", "ovsdb-server"):
                if ovs.pid(d):
                    out[f"{node.name} {d}"] = ovs.pid(d)
        return out

    def flows(self) -> dict[str, dict[str, int]]:
        """OpenFlow flows of every bridge of every node: {node: {bridge: n}}."""
        out = {}
        for node in self.lab.nodes():
            ovs = self.lab.ovs(node.name)
            out[node.name] = {}
            for br in ovs.vsctl("list-br").split():
                agg = ovs.ofctl("dump-aggregate", br, check=False)
                m = re.search(r"flow_count=(\d+)", agg)
                out[node.name][br] = int(m.group(1)) if m else -1
        return out


class FathomSystem(System):
    """fathom's lab and its own controller: by default one controller on a SQLite store, OpenFlow and
    OVSDB over plain TCP (`insecure`); with `db` (a PostgreSQL URL) one controller on it, or with
    `replicas` > 1 that many replicas of a cluster on it. A cluster's port calls go round the
    replicas, each port's call and its wait to one (`note` says which, and which replica masters the
    node's br-int)."""

    def __init__(self, lab_name: str, topo: Topology, name: str = "fathom", db: str | None = None,
                 replicas: int = 1, insecure: bool = True):
        self.lab, self.topo, self.name, self.db, self.replicas = Lab(lab_name), topo, name, db, replicas
        self.insecure = insecure
        self.api: Client | None = None
        self.apis: list[Client] = []      # a cluster's: one per replica
        self.waiters: list[Client] = []
        self.calls = 0
        self.stopped: list[int] = []      # pids of replicas stopped (keep_only)

    def up(self, progress) -> None:
        self.lab.down()
        progress(f"{self.name}: bringing up lab {self.lab.name}")
        state = self.lab.up(self.topo, str(TOPOLOGY), insecure=self.insecure, db=self.db,
                            replicas=self.replicas)
        urls = [r["url"] for r in state["controller"].get("replicas") or [state["controller"]]]
        self.apis = [Client(u, token=lab_token(state), timeout=60) for u in urls]
        self.callees = list(range(len(urls)))    # the replicas the calls go round
        # their own connections: waits run in a thread
        self.waiters = [Client(u, token=lab_token(state), timeout=60) for u in urls]
        self.api = self.apis[0]
        self.urls = urls
        self.networks = {n["name"]: n["id"] for n in self.api.list("/networks")}
        self.switches = {n["name"]: f"{datapath_id(n['id']):016x}" for n in self.api.list("/nodes")}

    def create_port(self, name, mac, ip, network, node):
        i = self.callees[self.calls % len(self.callees)]
        self.calls += 1
        port = self.apis[i].post("/ports", json={
            "network_id": self.networks[network], "name": name, "mac_address": mac,
            "fixed_ips": [{"ip_address": ip}], "node": node, "interface_name": name, "project_id": "bench"})["id"]
        return (i, port, node)

    def wait_up(self, handle, timeout):
        i, port, _ = handle
        try:
            got = self.waiters[i].wait_status("ports", port, "active", timeout=timeout)
        except ApiError:
            return None
        return time.time() if got["status"] == "active" else None

    def delete_port(self, handle):
        i, port, _ = handle
        self.apis[i].delete(f"/ports/{port}")

    def note(self, handle) -> dict:
        """A cluster's: the replica that took the port's call and its wait, and the master of the
        port's node's br-int (replica indexes)."""
        if len(self.apis) < 2:
            return {}
        i, _, node = handle
        cluster = self.api.get("/cluster")
        address = {r["id"]: r["address"] for r in cluster["replicas"]}
        master = next((address.get(x["holder"]) for x in cluster["leases"] if x["switch"] == self.switches[node]), None)
        return {"replica": i, "master": self.urls.index(master) if master in self.urls else None}

    def control_plane(self):
        replicas = (self.lab.state().get("controller") or {}).get("replicas")
        pids = [r["pid"] for r in replicas] if replicas else [(self.lab.state().get("controller") or {}).get("pid")]
        out = {}
        for k, ctl in enumerate(p for p in pids if p):
            me = "fathom-controller" + (f"-{k}" if replicas else "")
            out[me] = ctl
            for i, pid in enumerate(procs.children(ctl)):
                out[f"{me}-child{i}"] = pid
        # node agents, if the lab runs any (`fathom agent` naming this lab's run dir)
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    cmd = (d / "cmdline").read_text().replace("\0", " ")
                except OSError:
                    continue
                if " agent" in cmd and "fathom" in cmd and str(self.lab.dir) in cmd:
                    out[f"fathom-agent-{d.name}"] = int(d.name)
        return out

    def keep_only(self, master: int) -> list[int]:
        """Stop (SIGSTOP) every replica but `master`, whose API alone is used from then on; the
        stopped replicas' indexes."""
        replicas = self.lab.state()["controller"]["replicas"]
        stopped = [i for i in range(len(replicas)) if i != master]
        for i in stopped:
            os.kill(replicas[i]["pid"], signal.SIGSTOP)
        self.stopped = [replicas[i]["pid"] for i in stopped]
        self.callees, self.api = [master], self.apis[master]
        return stopped

    def down(self):
        for pid in self.stopped:    # a stopped process would not take the lab's SIGTERM
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stopped = []
        for c in self.apis + self.waiters:
            c.close()
        self.apis, self.waiters = [], []
        super().down()


class OvnSystem(System):
    name = "ovn"

    def __init__(self, lab_name: str, topo: Topology):
        self.lab, self.topo = Lab(lab_name), topo
        self.ovn = Ovn(self.lab)
        self.monitor: UpMonitor | None = None

    def up(self, progress) -> None:
        self.lab.down()
        progress(f"ovn: bringing up lab {self.lab.name} (nodes only) and OVN's daemons")
        nodes_only = self.topo.model_copy(update={
            "networks": [], "routers": [], "nodes": [n.model_copy(update={"vms": []}) for n in self.topo.nodes]})
        self.lab.up(nodes_only, str(TOPOLOGY), standalone=True)
        self.ovn.start()
        self.monitor = UpMonitor(self.ovn)
        for net in self.topo.networks:
            self.ovn.add_switch(net.name)
        self.ovn.add_security_group()
        for r in self.topo.routers:
            self.ovn.add_router(r.name, {n: (ROUTER_MACS[n], f"{self.topo.network(n).gateway}/{self.topo.network(n).cidr.prefixlen}")
                                         for n in r.networks})
        progress("ovn: VMs")
        for node, vm in self.topo.vms():
            self.ovn.add_port(vm.network, vm.name, vm.mac, str(vm.ip.ip))
            self.lab.add_vm(node.name, vm.name, vm.mac, str(vm.ip), str(self.topo.network(vm.network).gateway))
            self.lab.plug_vm(node.name, vm.name, vm.mac, vm.network)
        for _, vm in self.topo.vms():
            if self.monitor.wait_up(vm.name, 30) is None:
                raise LabError(f"OVN: port {vm.name} not up after 30 s")

    def create_port(self, name, mac, ip, network, node):
        self.monitor.forget(name)
        self.ovn.add_port(network, name, mac, ip)
        return name

    def wait_up(self, handle, timeout):
        return self.monitor.wait_up(handle, timeout)

    def delete_port(self, handle):
        self.ovn.delete_port(handle)
        self.monitor.forget(handle)

    def control_plane(self):
        return self.ovn.pids()

    def down(self):
        if self.monitor:
            self.monitor.close()
        self.ovn.stop()
        super().down()


class Bench:
    def __init__(self, prefix: str = "ov", repeats: int = 3, ports: int = 20, seconds: int = 5, batch: int = 50,
                 window_s: float = 30.0, rest_s: float = 60.0, large: bool = True, shape: str = "two-networks",
                 progress=lambda msg: None):
        if shape not in SHAPES:
            raise ValueError(f"shape {shape!r}: one of {', '.join(SHAPES)}")
        self.topo = load(TOPOLOGY)
        self.systems = self.make_systems(prefix)
        self.repeats, self.n_ports, self.seconds = repeats, ports, seconds
        self.batch, self.window_s, self.rest_s, self.large, self.shape = batch, window_s, rest_s, large, shape
        self.progress = progress
        self.vm = {vm.name: vm for _, vm in self.topo.vms()}
        self.seq = {s.name: 0 for s in self.systems}   # ports made so far per lab: unique names, MACs, addresses

    def make_systems(self, prefix: str) -> list[System]:
        return [FathomSystem(f"{prefix}f", self.topo), OvnSystem(f"{prefix}o", self.topo)]

    # ------------------------------------------------------------------ helpers
    def turn(self, i: int) -> list[System]:
        """Both systems, the first alternating with i."""
        return self.systems if i % 2 == 0 else self.systems[::-1]

    def new_address(self, s: System, network: str) -> tuple[str, str, str]:
        """A fresh (name, MAC, IP) in `network` of system s: never reused within a run, so no state left
        over from a removed port can help or hinder the next one."""
        self.seq[s.name] += 1
        n = self.seq[s.name]
        net = self.topo.network(network)
        if 256 + n >= net.cidr.num_addresses - 1:
            raise LabError(f"{net.cidr} has no address left for port {n}: fewer --ports")
        ip = str(net.cidr.network_address + 256 + n)    # above the VMs' first /24 of the subnet
        return f"p{n}", f"02:0c:{1 if network == 'blue' else 2:02x}:00:{n >> 8 & 0xff:02x}:{n & 0xff:02x}", ip

    # ------------------------------------------------------------------ checks
    def check_traffic(self, sys_: System) -> dict:
        """One echo on each path (ARP and first-packet misses: up to 20 tries)."""
        out = {}
        for path, (src, dst) in PATHS.items():
            ok = False
            for _ in range(20):
                if sys_.lab.run(src, "ping", "-c", "1", "-W", "1", str(self.vm[dst].ip.ip)).returncode == 0:
                    ok = True
                    break
            out[path] = ok
        return out

    def conntrack(self, sys_: System) -> int:
        """Connections of the traffic check's source VM in its node's conntrack table: both systems
        pass the VMs' traffic through conntrack for their security group, and this shows they do."""
        src = self.vm[PATHS["same_subnet"][0]]
        node = next(n.name for n, vm in self.topo.vms() if vm.name == src.name)
        table = sys_.lab.ovs(node).appctl("dpctl/dump-conntrack")
        return sum(f"src={src.ip.ip}," in line for line in table.splitlines())

    # ------------------------------------------------------------------ data plane
    def throughput(self) -> dict:
        res = {s.name: {p: [] for p in PATHS} for s in self.systems}
        for r in range(self.repeats):
            for s in self.turn(r):
                for path, (src, dst) in PATHS.items():
                    self.progress(f"throughput {s.name} {path} (repeat {r + 1}/{self.repeats})")
                    got = iperf3(s.lab.ns(src), s.lab.ns(dst), str(self.vm[dst].ip.ip), seconds=self.seconds,
                                 omit=1, check=False)
                    res[s.name][path].append(got.gbps if got else 0.0)
        return {name: {p: {"gbps": v, **dist(v)} for p, v in paths.items()} for name, paths in res.items()}

    # ------------------------------------------------------------------ port up
    def measure_port(self, s: System, order: str) -> dict:
        """One new port on c1 (network blue) in plug order `order`; removed again at the end."""
        name, mac, ip = self.new_address(s, "blue")
        lab, target = s.lab, self.vm[PROBE_TARGET]
        vns, tns = lab.ns(name), lab.ns(PROBE_TARGET)
        net = self.topo.network("blue")
        lab.add_vm("c1", name, mac, f"{ip}/{net.cidr.prefixlen}", str(net.gateway))
        run(["ip", "-n", vns, "neigh", "replace", str(target.ip.ip), "lladdr", target.mac, "dev", "eth0"])
        run(["ip", "-n", tns, "neigh", "replace", ip, "lladdr", mac, "dev", "eth0"])
        probe = subprocess.Popen(argv(["ping", "-D", "-n", "-i", "0.002", "-W", "0.05",
                                       "-w", str(int(UP_TIMEOUT_S) + 5), str(target.ip.ip)], vns),
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        echo: dict = {}
        got_echo = threading.Event()

        def read_probe():
            for line in probe.stdout:
                m = re.match(r"\[([\d.]+)\].*time=", line)
                if m and not echo:
                    echo["t"] = float(m.group(1))
                    got_echo.set()
            got_echo.set()
        threading.Thread(target=read_probe, daemon=True).start()
        time.sleep(0.05)
        up: dict = {}
        t: dict = {}

        def api_call():
            t["api"] = time.time()
            handle = s.create_port(name, mac, ip, "blue", "c1")
            t["api_done"] = time.time()
            waiter = threading.Thread(target=lambda: up.update(t=s.wait_up(handle, UP_TIMEOUT_S)), daemon=True)
            waiter.start()
            return handle, waiter

        def plug():
            t["plug"] = time.time()
            lab.plug_vm("c1", name, mac, "blue")
            t["plug_done"] = time.time()

        handle = None
        try:
            if order == "plug_first":
                plug()
                handle, waiter = api_call()
            elif order == "api_then_plug":
                handle, waiter = api_call()
                plug()
            else:
                handle, waiter = api_call()
                time.sleep(max(0.0, t["api_done"] + 0.5 - time.time()))
                plug()
            waiter.join(UP_TIMEOUT_S + 5)
            got_echo.wait(UP_TIMEOUT_S + 5)
            noted = s.note(handle)
        finally:
            probe.kill()
            probe.wait()
            if handle is not None:
                s.delete_port(handle)
            lab.remove_vm("c1", name)
            run(["ip", "-n", tns, "neigh", "del", ip, "dev", "eth0"], check=False)
        t0 = max(t["api"], t["plug"])   # the port exists in both senses: API call issued, VIF plugged
        t_up, t_echo = up.get("t"), echo.get("t")
        return {"port": name, "order": order, "t_api": t["api"], "t_api_done": t["api_done"], "t_plug": t["plug"],
                "t_plug_done": t["plug_done"], "t_up": t_up, "t_echo": t_echo,
                "up_ms": None if t_up is None else (t_up - t0) * 1000,
                "echo_ms": None if t_echo is None else (t_echo - t0) * 1000,
                "up_before_vif": t_up is not None and t_up < t["plug"], **noted}

    def port_up(self, size_label: str, orders=tuple(ORDERS)) -> dict:
        raw = {s.name: {o: [] for o in orders} for s in self.systems}
        for i in range(self.n_ports):
            for j, order in enumerate(orders):
                for s in self.turn(i + j):
                    self.progress(f"port up, tenant {size_label}: {s.name} {order} port {i + 1}/{self.n_ports}")
                    raw[s.name][order].append(self.measure_port(s, order))
        return self.port_stats(raw)

    @staticmethod
    def port_stats(raw: dict) -> dict:
        """{system: {order: [measure_port's records]}} -> each cell's distributions and counts."""
        out = {}
        for name, orders in raw.items():
            out[name] = {}
            for order, runs in orders.items():
                ups = [r["up_ms"] for r in runs if r["up_ms"] is not None]
                echoes = [r["echo_ms"] for r in runs if r["echo_ms"] is not None]
                after = [r["echo_ms"] - r["up_ms"] for r in runs if r["echo_ms"] is not None and r["up_ms"] is not None]
                out[name][order] = {"up_ms": dist(ups), "echo_ms": dist(echoes), "echo_after_up_ms": dist(after),
                                    "ports": len(runs),
                                    "never_up": sum(r["up_ms"] is None for r in runs),
                                    "never_echo": sum(r["echo_ms"] is None for r in runs),
                                    "up_before_vif": sum(r["up_before_vif"] for r in runs), "runs": runs}
        return out

    # ------------------------------------------------------------------ batches (tenant growth) and CPU
    def add_vif(self, s: System, node: str, network: str) -> tuple[str, str, str]:
        """A VIF without a guest (both veth ends in the node), plugged like a VM's."""
        name, mac, ip = self.new_address(s, network)
        ns = s.lab.ns(node)
        run(["ip", "link", "add", name, "netns", ns, "type", "veth", "peer", "name", name + "g", "netns", ns])
        run(["ip", "link", "set", name + "g", "up"], ns=ns)
        run(["ip", "link", "set", name, "up"], ns=ns)
        return name, mac, ip

    def groups(self) -> dict[str, dict[str, int]]:
        out = {}
        for s in self.systems:
            out[f"{s.name}:control_plane"] = s.control_plane()
            out[f"{s.name}:node_ovs"] = s.node_ovs()
        return out

    def grow(self, s: System, n: int) -> dict:
        """n ports (API call, then the VIF at once; alternately on c1 and c2; in blue and green in
        turn, or all in blue: `shape`) to all reported up: CPU to all-up and over a fixed window from
        the first call."""
        groups = {"control_plane": s.control_plane(), "node_ovs": s.node_ovs()}
        cpu = procs.CpuWindow(groups).start()
        t0 = time.monotonic()
        handles = []
        for i in range(n):
            node = ("c1", "c2")[i % 2]
            network = "blue" if self.shape == "one-network" else ("blue", "green")[i // 2 % 2]
            name, mac, ip = self.add_vif(s, node, network)
            handles.append(s.create_port(name, mac, ip, network, node))
            s.lab.plug_vm(node, name, mac, network)
        api_s = time.monotonic() - t0
        never = sum(s.wait_up(h, max(1.0, UP_TIMEOUT_S * 3 - (time.monotonic() - t0))) is None for h in handles)
        all_up_s = time.monotonic() - t0
        to_all_up = cpu.read()
        time.sleep(max(0.0, self.window_s - (time.monotonic() - t0)))
        window = cpu.read()
        return {"ports": n, "api_and_plug_s": api_s, "all_up_s": all_up_s, "never_up": never,
                "cpu_s_to_all_up": to_all_up, "window_s": max(self.window_s, time.monotonic() - t0),
                "cpu_s_window": window}

    def at_rest(self) -> dict:
        """Both systems idle at once for rest_s, after SETTLE_S: CPU of each group, and RSS at the end."""
        time.sleep(SETTLE_S)
        groups = self.groups()
        cpu = procs.CpuWindow(groups).start()
        time.sleep(self.rest_s)
        return {"seconds": self.rest_s, "cpu_s": cpu.read(), "rss": procs.rss(groups)}

    def snapshot(self) -> dict:
        return {s.name: {"flows": s.flows(), "rss": procs.rss({"control_plane": s.control_plane(),
                                                               "node_ovs": s.node_ovs()})} for s in self.systems}

    def down(self) -> None:
        """Every system's lab down, each whatever the others did."""
        for s in self.systems:
            try:
                s.down()
            except Exception as e:  # noqa: BLE001 - the other labs must come down too
                self.progress(f"{s.name}: lab down failed: {e}")

    # ------------------------------------------------------------------ run
    def run(self) -> dict:
        started = time.time()
        env = environment()
        env["machine_at_start"] = machine_activity(tuple(f"/{s.lab.name}/" for s in self.systems))
        try:
            for s in self.systems:
                s.up(self.progress)
            doc = {"benchmark": "ovn-compare", "environment": env,
                   "parameters": {"repeats": self.repeats, "ports_per_run": self.n_ports, "iperf_seconds": self.seconds,
                                  "batch": self.batch, "window_s": self.window_s, "rest_s": self.rest_s,
                                  "large_tenant": self.large, "shape": self.shape, "orders": ORDERS,
                                  "topology": str(TOPOLOGY)},
                   "versions": versions()}
            doc["traffic_check"] = {s.name: self.check_traffic(s) for s in self.systems}
            for name, paths in doc["traffic_check"].items():
                if not all(paths.values()):
                    raise LabError(f"{name}: no traffic on {[p for p, ok in paths.items() if not ok]}")
            doc["conntrack"] = {s.name: self.conntrack(s) for s in self.systems}
            small = len(self.topo.vms())
            doc["tenants"] = {}
            t = doc["tenants"][str(small)] = {"ports": small, "snapshot": self.snapshot()}
            if self.rest_s:
                self.progress(f"at rest, tenant of {small} ports ({self.rest_s:.0f} s)")
                t["at_rest"] = self.at_rest()
            doc["throughput"] = self.throughput()
            t["port_up"] = self.port_up(str(small))
            if self.large:
                grown: dict = {s.name: [] for s in self.systems}
                for k in range(2):   # two batches: 4 -> 4 + batch -> 4 + 2 batch ports
                    for s in self.turn(k):
                        self.progress(f"batch {k + 1}/2 of {self.batch} ports: {s.name}")
                        grown[s.name].append(self.grow(s, self.batch))
                large = small + 2 * self.batch
                t2 = doc["tenants"][str(large)] = {"ports": large, "batches": grown, "snapshot": self.snapshot()}
                if self.rest_s:
                    self.progress(f"at rest, tenant of {large} ports ({self.rest_s:.0f} s)")
                    t2["at_rest"] = self.at_rest()
                t2["port_up"] = self.port_up(str(large))
            env["machine_at_end"] = machine_activity(tuple(f"/{s.lab.name}/" for s in self.systems))
            doc["elapsed_s"] = time.time() - started
            return doc
        finally:
            self.down()


class ClusterBench(Bench):
    """`fathom bench ovn-compare --replicas N`: fathom with one controller against fathom with N
    controller replicas (`fathom controller --cluster`), no OVN. Both labs are up at once, each on
    its own database of one PostgreSQL server the bench starts (durable, as `fathom bench ha`'s), so
    the store is not the difference. Measured: port API call -> `active` and -> first echo, the VIF
    plugged first (ORDER: the clock starts at the API call), ports alternating between the systems,
    `repeats` rounds of `ports` ports each. The cluster's calls go round its replicas, a port's call
    and its wait to the same one; each port's record names that replica and the master of c1's br-int.
    Both labs run OpenFlow and OVSDB over TLS, as a cluster is deployed (docs/ha.md) and as `fathom
    bench ha` runs it.

    A lab's bring-up (every VM port active, every switch mastered, an echo on both paths) is tried up
    to UP_TRIES times, each on a fresh database; every failed try is in the results (`up_failures`;
    logs kept under $FATHOM_LAB_KEEP_LOGS)."""
    ORDER = "plug_first"
    UP_TRIES = 3

    def __init__(self, prefix: str = "oc", replicas: int = 3, repeats: int = 3, ports: int = 20,
                 stop_others: bool = False, progress=lambda msg: None):
        self.n_replicas, self.stop_others = replicas, stop_others
        super().__init__(prefix=prefix, repeats=repeats, ports=ports, rest_s=0, large=False, progress=progress)

    def make_systems(self, prefix: str) -> list[System]:
        return [FathomSystem(f"{prefix}1", self.topo, name="fathom-1", insecure=False),
                FathomSystem(f"{prefix}{self.n_replicas}", self.topo, name=f"fathom-{self.n_replicas}",
                             replicas=self.n_replicas, insecure=False)]

    def settled(self, s: FathomSystem) -> None:
        """Every replica live and every switch mastered, before any port is measured."""
        from fathom.bench.ha import SETTLE_TIMEOUT_S, wait

        def done():
            c = s.api.get("/cluster")
            return sum(r["live"] for r in c["replicas"]) == len(s.apis) and all(x["holder"] for x in c["leases"])
        wait(done, SETTLE_TIMEOUT_S, f"{s.name}: every replica live and every switch mastered")

    def alone(self, s: FathomSystem) -> list[int]:
        """`stop_others`: every replica but the master of c1's br-int (where the measured ports are)
        stopped, measured once that one holds every lease: the cluster's own work on a port's path
        (its change feed, claims, status notifications and lease rounds) without the other
        replicas' passes on the same cores. The stopped replicas' indexes."""
        from fathom.bench.ha import SETTLE_TIMEOUT_S, wait
        master = s.note((0, None, "c1"))["master"]
        if master is None:
            raise LabError(f"{s.name}: nobody masters c1's br-int")
        stopped = s.keep_only(master)
        holders = lambda: {x["holder"] for x in s.api.get("/cluster")["leases"]}
        wait(lambda: len(holders()) == 1, SETTLE_TIMEOUT_S, f"{s.name}: replica {master} holding every lease")
        return stopped

    def run(self) -> dict:
        from fathom.bench.postgres import PostgresServer
        started = time.time()
        env = environment()
        env["machine_at_start"] = machine_activity(tuple(f"/{s.lab.name}/" for s in self.systems))
        pg = PostgresServer(durable=True).start()
        up_failures, stopped = [], []
        try:
            traffic = {}
            for s in self.systems:
                for attempt in range(self.UP_TRIES):
                    s.db = pg.new_database()
                    try:
                        s.up(self.progress)
                        if s.replicas > 1:
                            self.settled(s)
                        traffic[s.name] = self.check_traffic(s)
                        if not all(traffic[s.name].values()):
                            raise LabError(f"no traffic on {[p for p, ok in traffic[s.name].items() if not ok]}")
                        if s.replicas > 1 and self.stop_others:
                            stopped = self.alone(s)
                        break
                    except (LabError, TimeoutError) as e:
                        up_failures.append({"system": s.name, "error": str(e).splitlines()[0]})
                        self.progress(f"{s.name}: lab up failed ({up_failures[-1]['error']})")
                        s.lab.keep_logs()
                        s.down()
                        if attempt == self.UP_TRIES - 1:
                            raise
            doc = {"benchmark": "ovn-compare", "environment": env,
                   "parameters": {"replicas": self.n_replicas, "repeats": self.repeats, "ports_per_run": self.n_ports,
                                  "order": self.ORDER, "store": "PostgreSQL 15 (durable), a database per system",
                                  "channels": "OpenFlow and OVSDB over TLS",
                                  "client": "round robin over the replicas, a port's call and its wait to one",
                                  "stopped": stopped,
                                  "topology": str(TOPOLOGY)},
                   "versions": versions(), "up_failures": up_failures}
            doc["traffic_check"] = traffic
            rounds = []
            for r in range(self.repeats):
                self.progress(f"repeat {r + 1}/{self.repeats}")
                rounds.append(self.port_up(f"4, repeat {r + 1}", orders=(self.ORDER,)))
            doc["repeats"] = [{name: {k: v for k, v in cells[self.ORDER].items() if k != "runs"}
                               for name, cells in got.items()} for got in rounds]
            doc["port_up"] = self.port_stats({s.name: {self.ORDER: [x for got in rounds for x in got[s.name][self.ORDER]["runs"]]}
                                              for s in self.systems})
            cluster_runs = doc["port_up"][self.systems[1].name][self.ORDER]["runs"]
            doc["by_replica"] = {
                which: {"up_ms": dist([x["up_ms"] for x in cluster_runs if x["up_ms"] is not None and pick(x)]),
                        "echo_ms": dist([x["echo_ms"] for x in cluster_runs if x["echo_ms"] is not None and pick(x)])}
                for which, pick in (("call_to_master", lambda x: x["replica"] == x["master"]),
                                    ("call_to_other", lambda x: x["replica"] != x["master"]))}
            doc["masters"] = sorted({x["master"] for x in cluster_runs}, key=str)
            doc["timeline"] = {s.name: timeline(s, doc["port_up"][s.name][self.ORDER]["runs"]) for s in self.systems}
            for s in self.systems:   # the controllers' logs, under $FATHOM_LAB_KEEP_LOGS when set
                s.lab.keep_logs()
            env["machine_at_end"] = machine_activity(tuple(f"/{s.lab.name}/" for s in self.systems))
            doc["elapsed_s"] = time.time() - started
            return doc
        finally:
            self.down()
            pg.stop()


# a reconciler's pass as its controller logs it (fathom.controller.reconciler.Reconciler.run_pass)
PASS_LINE = re.compile(r"^(\S+ \S+),(\d+) \w+ fathom\.reconciler: pass \d+ \(([^)]*)\): ([\d.]+) ms, "
                       r"\d+ switches changed; (.*)$")
# `wait`: from the first event the pass took (for a write through another replica, the change
# feed's notification arriving) to the pass's start
TIMELINE_STEPS = ("wait", "read", "compile", "make", "revalidate", "statuses")


def reconciler_passes(log: Path) -> list[dict]:
    """The passes a controller's log names: start and end (epoch seconds, this host's clock), and
    each step's milliseconds."""
    out = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else ():
        m = PASS_LINE.match(line)
        if m:
            end = time.mktime(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) + int(m[2]) / 1000
            steps = {k: float(v) for k, _, v in (x.partition(" ") for x in m[5].split(", "))}
            out.append({"start": end - float(m[4]) / 1000, "end": end, "ms": float(m[4]), "steps": steps})
    return out


def timeline(s: FathomSystem, runs: list[dict]) -> dict:
    """Where each port's time went, from the API call (ms): the call answered (its commit), the
    pass of the port's master (the master of c1's br-int; one controller: its only one) that turned
    it `active` (the first to start after the call with a `revalidate` step: a status turning
    active waits for the datapath), that pass's steps, and the client seeing `active` after it.
    Each run gets its figures (`timeline`); returned: their medians, in all and by the replica the
    call went to."""
    logs = {i: reconciler_passes(s.lab.dir / f"controller{f'-{i}' if i else ''}.log")
            for i in range(max(1, s.replicas))}
    for x in runs:
        passes = logs.get(x.get("master") if s.replicas > 1 else 0, [])
        p = next((p for p in passes if p["start"] >= x["t_api"] - 0.005 and "revalidate" in p["steps"]), None)
        if p is None or x["t_up"] is None or p["end"] > x["t_up"] + 0.05:
            x["timeline"] = None
            continue
        x["timeline"] = {"api_answered_ms": 1000 * (x["t_api_done"] - x["t_api"]),
                         "pass_start_ms": 1000 * (p["start"] - x["t_api"]), "pass_ms": p["ms"],
                         **{f"{k}_ms": p["steps"].get(k, 0.0) for k in TIMELINE_STEPS},
                         "active_after_pass_ms": 1000 * (x["t_up"] - p["end"])}

    def medians(pick) -> dict:
        got = [x["timeline"] for x in runs if x.get("timeline") and pick(x)]
        return {"n": len(got), **({k: statistics.median(t[k] for t in got) for k in got[0]} if got else {})}
    out = {"all": medians(lambda x: True)}
    if s.replicas > 1:
        out["call_to_master"] = medians(lambda x: x["replica"] == x["master"])
        out["call_to_other"] = medians(lambda x: x["replica"] != x["master"])
    return out


def versions() -> dict:
    def first(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return None
    return {"ovn_northd": first(["ovn-northd", "--version"]), "ovn_controller": first(["ovn-controller", "--version"]),
            "ovs_vswitchd": first(["ovs-vswitchd", "--version"])}


# ---------------------------------------------------------------------- report
def _ratio(a, b) -> str:
    """a / b, or a dash when either is missing or not positive (a port reported up before it could be)."""
    return f"{a / b:.2f}" if a is not None and b is not None and a > 0 and b > 0 else "—"


def _p(d: dict, key: str) -> float | None:
    return d.get(key) if d.get("n") else None


def _ms(d: dict) -> str:
    return f"{d['p50']:.0f} / {d['p99']:.0f}" if d.get("n") else "—"


def _spread(d: dict) -> str:
    return f"{d['p50']:.0f} / {d['max']:.0f}" if d.get("n") else "—"


def markdown(doc: dict) -> str:
    if "replicas" in doc["parameters"]:
        return cluster_markdown(doc)
    env = doc["environment"]
    L = [f"Run of {env['date_utc']} ({doc.get('elapsed_s', 0):.0f} s), command `{doc.get('command', 'fathom bench ovn-compare')}`; "
         f"{env['cpus']} CPUs ({env['cpu_model']}), kernel {env['kernel']}, {doc['versions']['ovs_vswitchd']}, "
         f"{doc['versions']['ovn_northd']}; load average at start {env['machine_at_start']['loadavg']}, "
         f"{env['machine_at_start']['foreign_ovs_vswitchd']} other labs' ovs-vswitchd running.", "",
         "Ratios are fathom / OVN: above 1 means fathom is faster (throughput) or slower and costlier "
         "(latency, CPU, memory).", ""]
    if "conntrack" in doc:
        L += [f"Both run every VM port in the project's default security group, statefully: connections of the "
              f"traffic check's source VM in its node's conntrack table: fathom {doc['conntrack']['fathom']}, "
              f"OVN {doc['conntrack']['ovn']}.", ""]
    L += ["| path (cross node) | fathom TCP Gb/s mean [min–max] | OVN TCP Gb/s mean [min–max] | fathom / OVN (means) "
          "| fathom / OVN per repeat |", "|---|---|---|---|---|"]
    tp = doc["throughput"]
    for path in PATHS:
        f, o = tp["fathom"][path], tp["ovn"][path]
        per = ", ".join(_ratio(a, b) for a, b in zip(f["gbps"], o["gbps"]))
        L.append(f"| {path} | {f['mean']:.3f} [{f['min']:.3f}–{f['max']:.3f}] | {o['mean']:.3f} [{o['min']:.3f}–{o['max']:.3f}] "
                 f"| {_ratio(f['mean'], o['mean'])} | {per} |")
    shape = doc["parameters"].get("shape", "two-networks")
    L += ["", f"Port up (ms from the later of API call and VIF plug; p50 / p99; n ports per cell; the tenant grown "
              f"`{shape}`: {SHAPES[shape]}). First echo − reported up: how long after the system says up the "
              "port first forwards (p50 / max; negative: the echo came first):", "",
          "| tenant ports | plug order | n | fathom → reported up | OVN → reported up | p50 ratio | fathom → first echo "
          "| OVN → first echo | p50 ratio | first echo − reported up, fathom | first echo − reported up, OVN "
          "| reported up before the VIF existed (fathom / OVN) | never up / no echo (fathom; OVN) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for size, t in doc["tenants"].items():
        for order in ORDERS:
            if "port_up" not in t:
                continue
            f, o = t["port_up"]["fathom"][order], t["port_up"]["ovn"][order]
            L.append(f"| {size} | {order} | {f['ports']} | {_ms(f['up_ms'])} | {_ms(o['up_ms'])} | "
                     f"{_ratio(_p(f['up_ms'], 'p50'), _p(o['up_ms'], 'p50'))} | {_ms(f['echo_ms'])} | {_ms(o['echo_ms'])} | "
                     f"{_ratio(_p(f['echo_ms'], 'p50'), _p(o['echo_ms'], 'p50'))} | {_spread(f.get('echo_after_up_ms', {}))} | "
                     f"{_spread(o.get('echo_after_up_ms', {}))} | {f['up_before_vif']} / {o['up_before_vif']} | "
                     f"{f['never_up']}/{f['never_echo']}; {o['never_up']}/{o['never_echo']} |")
    L += ["", "Control-plane CPU (utime + stime, seconds; the nodes' ovs-vswitchd + ovsdb-server apart):", "",
          "| tenant ports | window | fathom control plane s | OVN control plane s | ratio | fathom nodes' OVS s "
          "| OVN nodes' OVS s | time to all up, fathom / OVN s |", "|---|---|---|---|---|---|---|---|"]
    for size, t in doc["tenants"].items():
        if "at_rest" in t:
            c = t["at_rest"]["cpu_s"]
            f, o = c["fathom:control_plane"]["total"], c["ovn:control_plane"]["total"]
            L.append(f"| {size} | at rest, {t['at_rest']['seconds']:.0f} s (both idle at once) | {f:.2f} | {o:.2f} | "
                     f"{_ratio(f, o)} | {c['fathom:node_ovs']['total']:.2f} | {c['ovn:node_ovs']['total']:.2f} | |")
        for k, (fb, ob) in enumerate(zip(t.get("batches", {}).get("fathom", []), t.get("batches", {}).get("ovn", []))):
            before = int(size) - (2 - k) * fb["ports"]
            for key, label in (("cpu_s_to_all_up", "to all up"), ("cpu_s_window", f"{fb['window_s']:.0f} s from the first call")):
                f, o = fb[key]["control_plane"]["total"], ob[key]["control_plane"]["total"]
                L.append(f"| {before} → {before + fb['ports']} | batch of {fb['ports']}, {label} | {f:.2f} | {o:.2f} | {_ratio(f, o)} | "
                         f"{fb[key]['node_ovs']['total']:.2f} | {ob[key]['node_ovs']['total']:.2f} | "
                         + (f"{fb['all_up_s']:.1f} / {ob['all_up_s']:.1f} (of which issuing the calls and plugs: "
                            f"{fb['api_and_plug_s']:.1f} / {ob['api_and_plug_s']:.1f}; never up: {fb['never_up']} / {ob['never_up']})"
                            if key == "cpu_s_to_all_up" else "") + " |")
    L += ["", "Memory and flows:", "",
          "| tenant ports | fathom control plane RSS MB | OVN control plane RSS MB | ratio | fathom flows c1 / c2 / gw "
          "| OVN flows c1 / c2 / gw |", "|---|---|---|---|---|---|"]
    for size, t in doc["tenants"].items():
        snap = t["snapshot"]
        f, o = snap["fathom"]["rss"]["control_plane"]["total_mb"], snap["ovn"]["rss"]["control_plane"]["total_mb"]

        def flows(fl):
            return " / ".join(str(sum(fl[n].values())) for n in ("c1", "c2", "gw"))
        L.append(f"| {size} | {f:.0f} | {o:.0f} | {_ratio(f, o)} | {flows(snap['fathom']['flows'])} | {flows(snap['ovn']['flows'])} |")
    return "\n".join(L) + "\n"


def cluster_markdown(doc: dict) -> str:
    """ClusterBench's results: one controller against the cluster, pooled and per repeat."""
    env, par = doc["environment"], doc["parameters"]
    one, many = (f"fathom-{n}" for n in (1, par["replicas"]))
    order = par["order"]
    L = [f"Run of {env['date_utc']} ({doc.get('elapsed_s', 0):.0f} s), command `{doc.get('command', '')}`; "
         f"{env['cpus']} CPUs, load average at start {env['machine_at_start']['loadavg']}, "
         f"{env['machine_at_start']['foreign_ovs_vswitchd']} other labs' ovs-vswitchd running"
         + ("; a busy machine" if env.get("contended") else "") + ".", "",
         f"fathom with one controller ({one}) and with {par['replicas']} replicas ({many}), each on its own database "
         f"of one PostgreSQL; VIF plugged, then the API call; ms from the API call; {par['client']}. "
         f"Ratio: {many} / {one} (above 1: the cluster is slower); p50 / p99 over the ports that turned active "
         f"(or echoed) within {UP_TIMEOUT_S:.0f} s: a port that never did is counted in the last column only."
         + (f" Replicas {', '.join(map(str, par['stopped']))} were stopped (SIGSTOP) once the leases settled "
            "(`--stop-others`): the one left masters every switch and takes every call, so this measures the "
            "cluster's own work on a port's path without the other replicas' passes." if par.get("stopped") else ""),
         "",
         "| | n | → active p50 / p99 | → first echo p50 / p99 | never active / no echo |", "|---|---|---|---|---|"]
    for name in (one, many):
        c = doc["port_up"][name][order]
        L.append(f"| {name} | {c['ports']} | {_ms(c['up_ms'])} | {_ms(c['echo_ms'])} | {c['never_up']} / {c['never_echo']} |")
    a, b = doc["port_up"][one][order], doc["port_up"][many][order]
    L.append(f"| ratio | | {_ratio(_p(b['up_ms'], 'p50'), _p(a['up_ms'], 'p50'))} / {_ratio(_p(b['up_ms'], 'p99'), _p(a['up_ms'], 'p99'))} "
             f"| {_ratio(_p(b['echo_ms'], 'p50'), _p(a['echo_ms'], 'p50'))} / {_ratio(_p(b['echo_ms'], 'p99'), _p(a['echo_ms'], 'p99'))} | |")
    L += ["", "Per repeat (→ active p50 / p99, ms):", "", f"| repeat | {one} | {many} | ratio p50 / p99 |", "|---|---|---|---|"]
    for k, rep in enumerate(doc["repeats"]):
        x, y = rep[one]["up_ms"], rep[many]["up_ms"]
        L.append(f"| {k + 1} | {_ms(x)} | {_ms(y)} | {_ratio(_p(y, 'p50'), _p(x, 'p50'))} / {_ratio(_p(y, 'p99'), _p(x, 'p99'))} |")
    L += ["", f"{many} by the replica that took the call (masters of c1's br-int during the run: replica "
              f"{', '.join(map(str, doc['masters']))}):", "",
          "| call to | n | → active p50 / p99 | → first echo p50 / p99 |", "|---|---|---|---|"]
    for which, d in doc["by_replica"].items():
        L.append(f"| {which.removeprefix('call_to_')} | {d['up_ms'].get('n', 0)} | {_ms(d['up_ms'])} | {_ms(d['echo_ms'])} |")
    if doc.get("timeline"):
        L += ["", "Where the time went (medians, ms from the API call; the pass of the port's master that turned it "
              "active, as its log gives it):", "",
              "| | n | call answered | pass starts | pass | its first event → its start | read | compile | make "
              "| revalidate | statuses | active seen after the pass |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, parts in doc["timeline"].items():
            for which, t in parts.items():
                if t.get("n"):
                    label = name if which == "all" else f"{name}, call to {which.removeprefix('call_to_')}"
                    L.append(f"| {label} | {t['n']} | " + " | ".join(
                        f"{t[k]:.0f}" if t[k] >= 10 else f"{t[k]:.1f}"
                        for k in ("api_answered_ms", "pass_start_ms", "pass_ms", *(f"{s}_ms" for s in TIMELINE_STEPS),
                                  "active_after_pass_ms")) + " |")
    if doc.get("up_failures"):
        L += ["", "Lab bring-ups that failed and were tried again: "
              + "; ".join(f"{f['system']}: {f['error']}" for f in doc["up_failures"])]
    return "\n".join(L) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"fathom": "#4c72b0", "ovn": "#dd8452"}
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    w = 0.38
    ax = axes[0]
    for k, s in enumerate(SYSTEMS):
        vals = [doc["throughput"][s][p]["mean"] for p in PATHS]
        err = [[v - doc["throughput"][s][p]["min"] for v, p in zip(vals, PATHS)],
               [doc["throughput"][s][p]["max"] - v for v, p in zip(vals, PATHS)]]
        ax.bar([i + (k - 0.5) * w for i in range(len(PATHS))], vals, w, yerr=err, color=colors[s], label=s)
    ax.set_xticks(range(len(PATHS)), list(PATHS))
    ax.set_title("TCP Gb/s (mean, min–max)")
    ax.legend(fontsize=8)
    for ax, key, title in ((axes[1], "up_ms", "port up → reported up, ms"), (axes[2], "echo_ms", "port up → first echo, ms")):
        labels, x = [], 0
        for size, t in doc["tenants"].items():
            for order in ORDERS:
                if "port_up" not in t:
                    continue
                for k, s in enumerate(SYSTEMS):
                    cell = t["port_up"][s][order]
                    d = cell[key]
                    if not d.get("n"):
                        continue
                    if d["p50"] <= 0:   # reported up before the VIF existed: no latency to draw
                        ax.text(x + (k - 0.5) * w, 0.03, f"up before VIF {cell['up_before_vif']}/{cell['ports']}",
                                color=colors[s], fontsize=6, ha="center", va="bottom", rotation=90,
                                transform=ax.get_xaxis_transform())
                        continue
                    ax.bar(x + (k - 0.5) * w, d["p50"], w, color=colors[s], label=s if x == 0 else None)
                    if d["p99"] > 0:
                        ax.scatter([x + (k - 0.5) * w], [d["p99"]], color="k", marker="_", s=120)
                labels.append(f"{size}p {order}")
                x += 1
        ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(title + " (bar p50, tick p99)")
        ax.legend(fontsize=8)
    ax = axes[3]
    rows = []
    for size, t in doc["tenants"].items():
        if "at_rest" in t:
            c = t["at_rest"]["cpu_s"]
            rows.append((f"rest {size}p", c["fathom:control_plane"]["total"], c["ovn:control_plane"]["total"]))
        for k, (fb, ob) in enumerate(zip(t.get("batches", {}).get("fathom", []), t.get("batches", {}).get("ovn", []))):
            rows.append((f"batch {k + 1} window", fb["cpu_s_window"]["control_plane"]["total"],
                         ob["cpu_s_window"]["control_plane"]["total"]))
    for k, s in enumerate(SYSTEMS):
        ax.bar([i + (k - 0.5) * w for i in range(len(rows))], [r[1 + k] for r in rows], w, color=colors[s], label=s)
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], rotation=35, ha="right", fontsize=7)
    ax.set_title("control-plane CPU s")
    ax.legend(fontsize=8)
    fig.suptitle(f"fathom vs OVN, same lab ({doc['environment']['date_utc']}"
                 + (", crowded machine" if doc["environment"].get("contended") else "") + ")", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
