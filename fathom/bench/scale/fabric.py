"""`fathom bench scale`, fabric scale: N simulated nodes (fathom.bench.ofswitch: a switch in memory
speaking OpenFlow 1.4 to the controller over plain TCP, with a real `ovsdb-server` per node for the
bootstrap and port numbers) under a real `fathom controller`: port-up latency (API call → `active`
through Client.wait_status), the controller's CPU time per change, and a full resync of every wiped
switch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from fathom.bench import procs
from fathom.bench.report import dist

from .common import Controller, all_active, create_parallel


SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
NETWORK_SPAN = 10          # nodes a network spans (a tenant's VMs on ten hypervisors)
PORTS_PER_NETWORK = 100    # at most, on those nodes


def management_ip(i: int, net: int = 1) -> str:
    """Where simulated node `i`'s ovsdb-server listens: 127.<net>.x.y (every 127/8 address is local).
    Each run directory has its own `net` (`loopback_net`), so two runs at once do not meet."""
    return f"127.{net}.{i >> 8}.{(i & 0xFF) + 1}"


def loopback_net(run_dir: Path) -> int:
    return 1 + zlib.crc32(str(run_dir).encode()) % 250


class NodeOvsdb:
    """A real ovsdb-server standing for one simulated node: br-int as the controller's bootstrap wants
    it, the tunnel port and the VM interfaces with their OpenFlow port numbers (no ovs-vswitchd: the
    OpenFlow side is the simulated switch)."""

    def __init__(self, run_dir: Path, index: int, dpid: int, tunnel_ip: str, controller: str, interfaces: int,
                 net: int = 1):
        self.dir = run_dir / f"ovsdb{index}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ip = management_ip(index, net)
        db = self.dir / "conf.db"
        if db.exists():
            db.unlink()
        subprocess.run(["ovsdb-tool", "create", str(db), SCHEMA], check=True, capture_output=True)
        # TCP served as a node serves it (channels.manager_commands): from a Manager row with our
        # inactivity probe, so a controller at rest is not sent an echo every 5 s (ovsdb-server's
        # default for a --remote given on its command line) by each node
        subprocess.run(["ovsdb-server", str(db), f"--remote=punix:{self.dir}/db.sock",
                        "--remote=db:Open_vSwitch,Open_vSwitch,manager_options", f"--pidfile={self.dir}/pid",
                        f"--unixctl={self.dir}/ctl", f"--log-file={self.dir}/log", "--detach"],
                       check=True, capture_output=True)
        ops = [{"op": "insert", "table": "Interface", "uuid-name": "i0",
                "row": {"name": "vxlan0", "type": "vxlan", "ofport": 1,
                        "options": ["map", [["key", "flow"], ["remote_ip", "flow"]]]}},
               {"op": "insert", "table": "Port", "uuid-name": "p0",
                "row": {"name": "vxlan0", "interfaces": ["named-uuid", "i0"]}}]
        for j in range(interfaces):
            ops += [{"op": "insert", "table": "Interface", "uuid-name": f"i{j + 1}",
                     "row": {"name": vm_interface(j), "ofport": j + 2}},
                    {"op": "insert", "table": "Port", "uuid-name": f"p{j + 1}",
                     "row": {"name": vm_interface(j), "interfaces": ["named-uuid", f"i{j + 1}"]}}]
        from fathom.controller.bootstrap import CONTROLLER_MAX_BACKOFF_MS, CONTROLLER_PROBE_MS, OVSDB_PROBE_MS
        # the controller row as the bootstrap leaves it: with no ovs-vswitchd here, a transaction of
        # the bootstrap would wait for one to apply it (and time out)
        ops += [{"op": "insert", "table": "Controller", "uuid-name": "c",
                 "row": {"target": controller, "inactivity_probe": CONTROLLER_PROBE_MS,
                         "max_backoff": CONTROLLER_MAX_BACKOFF_MS}},
                {"op": "insert", "table": "Bridge", "uuid-name": "b",
                 "row": {"name": "br-int", "datapath_type": "netdev", "fail_mode": "secure",
                         "protocols": ["set", ["OpenFlow13", "OpenFlow14"]],
                         "other_config": ["map", [["datapath-id", f"{dpid:016x}"], ["disable-in-band", "true"]]],
                         "controller": ["named-uuid", "c"],
                         "ports": ["set", [["named-uuid", f"p{j}"] for j in range(interfaces + 1)]]}},
                {"op": "insert", "table": "Manager", "uuid-name": "m",
                 "row": {"target": f"ptcp:6640:{self.ip}", "inactivity_probe": OVSDB_PROBE_MS}},
                {"op": "insert", "table": "Open_vSwitch",
                 "row": {"bridges": ["named-uuid", "b"], "manager_options": ["named-uuid", "m"]}}]
        done = subprocess.run(["ovsdb-client", "transact", f"unix:{self.dir}/db.sock",
                               json.dumps(["Open_vSwitch", *ops])], capture_output=True, text=True, timeout=30)
        if done.returncode != 0 or '"error"' in done.stdout:
            raise RuntimeError(f"ovsdb {self.ip}: {done.stderr or done.stdout[:500]}")
        deadline = time.monotonic() + 10    # the Manager row's listener opens after the transaction
        while subprocess.run(["ovsdb-client", "list-dbs", f"tcp:{self.ip}:6640"], capture_output=True).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError(f"ovsdb {self.ip}: not listening on TCP")
            time.sleep(0.05)

    def stop(self) -> None:
        try:
            pid = int((self.dir / "pid").read_text())
            os.kill(pid, 15)
        except (OSError, ValueError):
            pass


def vm_interface(j: int) -> str:
    return f"vm{j}"


class Fleet:
    """The simulated switches' process (fathom.bench.ofswitch), driven over its stdin."""

    def __init__(self, of_port: int | None = None):
        """Every switch connects to the controller at `of_port`; None: to its node's OVSDB's targets."""
        target = ["--controller", f"127.0.0.1:{of_port}"] if of_port else []
        self.proc = subprocess.Popen([sys.executable, "-m", "fathom.bench.ofswitch", *target],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True)

    def call(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline() or '{"error": "the switch process exited"}')
        if "error" in answer:
            raise RuntimeError(f"simulated switches: {answer['error']}")
        return answer

    def cpu(self) -> float:
        return procs.cpu_seconds(self.proc.pid) or 0.0

    def stop(self) -> None:
        try:
            self.call(op="quit")
        except Exception:  # noqa: BLE001
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Size:
    nodes: int
    ports_per_node: int

    @property
    def ports(self) -> int:
        return self.nodes * self.ports_per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.ports_per_node}"


def parse_sizes(text: str) -> list[Size]:
    out = []
    for part in text.split(","):
        nodes, _, per = part.strip().partition("x")
        size = Size(int(nodes), int(per))
        if not (1 <= size.nodes <= 250 and 1 <= size.ports_per_node <= 1000):
            raise ValueError(f"{part!r}: NODESxPORTS with 1..250 nodes and 1..1000 ports per node")
        out.append(size)
    return out


def layout(size: Size) -> list[tuple[int, int, int]]:
    """(node index, interface index, network index) of every port: nodes in groups of NETWORK_SPAN,
    each group's ports spread over networks of at most PORTS_PER_NETWORK ports."""
    span = min(NETWORK_SPAN, size.nodes)
    per_group_networks = max(1, span * size.ports_per_node // PORTS_PER_NETWORK)
    out = []
    for n in range(size.nodes):
        group = n // span
        for j in range(size.ports_per_node):
            out.append((n, j, group * per_group_networks + j % per_group_networks))
    return out


def layout_snapshot(size: Size, plugged: bool = False):
    """The layout as a model, for running a pass's steps in-process on a fabric of this shape:
    nodes s0… (compute), a /22 subnet per network, every port bound to its node's interface vm<j>
    (`plugged`: with an OpenFlow port number there, 10 + j)."""
    from fathom.model import FixedIp, Network, Node, Port, Snapshot, Subnet
    ports = layout(size)
    n_networks = max(p[2] for p in ports) + 1
    nodes = tuple(Node(i + 1, f"s{i}", "compute", f"10.99.0.{i + 1}", f"198.18.0.{i + 1}", "complete",
                       ofports={f"vm{j}": 10 + j for j in range(size.ports_per_node)} if plugged else {})
                  for i in range(size.nodes))
    networks = tuple(Network(k + 1, f"net{k}", "p", "vxlan", 100 + k) for k in range(n_networks))
    subnets = tuple(Subnet(k + 1, f"s{k}", "p", k + 1, f"10.{k >> 6}.{(k & 63) * 4}.0/22",
                           f"10.{k >> 6}.{(k & 63) * 4}.1") for k in range(n_networks))
    count: dict[int, int] = {}
    out = []
    for i, (n, j, k) in enumerate(ports):
        c = count[k] = count.get(k, 0) + 1
        ip = f"10.{k >> 6}.{(k & 63) * 4 + (c + 2) // 256}.{(c + 2) % 256}"
        out.append(Port(i + 1, f"p{n}-{j}", "p", k + 1, f"02:00:00:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}",
                        (FixedIp(k + 1, ip),), f"s{n}", f"vm{j}"))
    return Snapshot(nodes, networks, subnets, tuple(out))


def layout_result(snapshot):
    """A pass's result over a layout model (`layout_snapshot`), for running the status steps
    in-process: every node's br-int connected and holding what it should; no object needs a switch
    yet (the caller says which do, `needs`)."""
    from fathom.apps.base import BR_INT, SwitchKey
    from fathom.controller.results import PassResult, SwitchResult
    from fathom.model import datapath_id
    res = PassResult(needs={})
    for n in snapshot.nodes:
        key = SwitchKey(BR_INT, n.name)
        res.switches[key] = SwitchResult(key, datapath_id(n.id), "ok", None, state="ok")
        res.desired[key] = None
    return res


def fabric_run(run_dir: Path, size: Size, samples: int = 20, db_url: str | None = None,
               progress=lambda msg: None) -> dict:
    """One fabric of `size` simulated nodes under a fresh controller: fill it, time `samples` new
    ports one by one (API call → active), then wipe every switch and time one full resync."""
    from fathom.model import datapath_id
    from fathom.stats import percentile
    run_dir.mkdir(parents=True, exist_ok=True)
    for f in run_dir.glob("fathom.db*"):
        f.unlink()
    ctl = Controller(run_dir, db_url or f"sqlite:///{run_dir}/fathom.db").start()
    ovsdbs: list[NodeOvsdb] = []
    fleet = None
    spare = max(1, -(-samples // size.nodes))   # interfaces per node kept for the timed ports
    try:
        api = ctl.api
        progress(f"{size}: {size.nodes} ovsdb-servers and nodes")
        nodes = []
        net = loopback_net(run_dir)
        for i in range(size.nodes):
            node = api.post("/nodes", json={"name": f"s{i}", "management_ip": management_ip(i, net),
                                            "tunnel_ip": f"10.99.{i >> 8}.{(i & 0xFF) + 1}"})
            nodes.append(node)
            ovsdbs.append(NodeOvsdb(run_dir, i, datapath_id(node["id"]), node["tunnel_ip"],
                                    f"tcp:127.0.0.1:{ctl.of_port}", size.ports_per_node + spare, net))
        fleet = Fleet(ctl.of_port)
        answer = fleet.call(op="connect", dpids=[datapath_id(n["id"]) for n in nodes], timeout=120)
        if answer["not_ready"]:
            raise RuntimeError(f"switches not admitted: {answer['not_ready'][:5]}")
        for n in nodes:
            ctl.api.wait_status("nodes", n["id"], timeout=120)
        ports = layout(size)
        n_networks = max(p[2] for p in ports) + 1
        networks = []
        for k in range(n_networks):
            net = api.post("/networks", json={"name": f"net{k}", "type": "vxlan"})
            api.post("/subnets", json={"network_id": net["id"], "cidr": f"10.{k >> 6}.{(k & 63) * 4}.0/22"})
            networks.append(net["id"])
        progress(f"{size}: creating {len(ports)} ports ({n_networks} networks)")
        t0 = time.monotonic()
        created = create_parallel(ctl, [{"network_id": networks[k], "name": f"p{n}-{j}", "node": f"s{n}",
                                          "interface_name": vm_interface(j)} for n, j, k in ports])
        fill_s = time.monotonic() - t0
        progress(f"{size}: waiting for {len(created)} ports to be active")
        all_active(api)
        settle_s = time.monotonic() - t0
        # every switch holds exactly the compiled flows: the controller reads each back and compares
        in_sync = [api.node_flows(f"s{i}")["in_sync"] for i in range(size.nodes)]
        counts = fleet.call(op="counts")
        flows_total = sum(counts["flows"].values())

        # port-up: one new port at a time, API call → active (Client.wait_status)
        progress(f"{size}: timing {samples} new ports")
        up_ms = []
        cpu0, fcpu0 = ctl.cpu(), fleet.cpu()
        for s in range(samples):
            n = s % size.nodes
            net = networks[next(k for nn, _, k in ports if nn == n)]
            t = time.perf_counter()
            port = api.post("/ports", json={"network_id": net, "name": f"sample{s}", "node": f"s{n}",
                                            "interface_name": vm_interface(size.ports_per_node + s // size.nodes)})
            got = api.wait_status("ports", port["id"], timeout=120)
            up_ms.append((time.perf_counter() - t) * 1000)
            if got["status"] != "active":
                raise RuntimeError(f"sample port {port['id']}: {got['status']} {got.get('status_reason')}")
        cpu_per_change = (ctl.cpu() - cpu0) / samples
        fleet_cpu_per_change = (fleet.cpu() - fcpu0) / samples
        rss_mb = procs.rss_mb(ctl.proc.pid)      # the controller holding the whole fabric, at rest

        # full resync: every switch wiped, one audit pass puts every flow back
        progress(f"{size}: full resync of {size.nodes} wiped switches")
        before = fleet.call(op="counts")
        fleet.call(op="wipe")
        cpu0, fcpu0 = ctl.cpu(), fleet.cpu()
        t = time.perf_counter()
        api.post("/sync", timeout=900)
        resync_s = time.perf_counter() - t
        resync_cpu = ctl.cpu() - cpu0
        after = fleet.call(op="counts")
        restored = sum(after["flows"].values())
        return {"size": str(size), "nodes": size.nodes, "ports": len(created), "networks": n_networks,
                "fill_seconds": fill_s, "settle_seconds": settle_s, "flows_total": flows_total,
                "flows_per_switch_max": max(counts["flows"].values()),
                "switches_in_sync": sum(in_sync), "port_up_ms": dist(up_ms),
                "port_up_p50_ms": percentile(up_ms, 50), "port_up_p99_ms": percentile(up_ms, 99),
                "controller_cpu_ms_per_change": 1000 * cpu_per_change,
                "switches_cpu_ms_per_change": 1000 * fleet_cpu_per_change,
                "controller_rss_mb": rss_mb, "controller_bytes_per_flow": rss_mb * 2**20 / flows_total if rss_mb else None,
                "resync_seconds": resync_s, "resync_flows": restored,
                "resync_flows_per_second": restored / resync_s if resync_s else None,
                "resync_controller_cpu_s": resync_cpu, "resync_switches_cpu_s": fleet.cpu() - fcpu0,
                "resync_complete": after["flows"] == before["flows"] and after["groups"] == before["groups"]}
    finally:
        if fleet is not None:
            fleet.stop()
        ctl.stop()
        for o in ovsdbs:
            o.stop()
