"""`fathom bench secgroups`: what a security group costs against none, and how much of that is the
connection tracker and how much the rules.

One lab (two compute nodes, one VXLAN network): VM src on c1 sends to dst1 on c1 (same node) and to dst2 on
c2 (across the tunnel). Three modes, interleaved over repeats on the same lab and ports:

- `none`: the three ports without port security (no conntrack, no rules);
- `sg1`: the three ports in a group of the fewest rules the traffic needs — egress to anywhere and one
  ingress rule, TCP 5201 (both tests listen there) — so every packet goes through conntrack and one rule;
- `sg100`: the three ports in a group of 100 rules — the two of `sg1` and 98 ingress rules that match none
  of this traffic (other ports, other prefixes).

Per mode and path: iperf3 TCP throughput, and new TCP connections per second (clients in src connect
to a listener in dst and close at once, with RST so no TIME_WAIT piles up; every connection is a new
conntrack entry in the zone of each filtering port's network: one on one node). Beside each figure, what the datapaths of the nodes on the
path did for it (`dpif-netdev/pmd-stats-show`): passes per packet (1 + recirculations), upcalls, the
exact-match cache's share of lookups, subtables probed per megaflow hit, and ovs-vswitchd CPU per packet. The figures are ratios: sg1 / none (the price of conntrack), sg100 / sg1
(the price of the 99 further rules) and sg100 / none (target >= 0.9).
"""
from __future__ import annotations

import re
import subprocess
import time

from fathom.apps.secgroups.compiler import established_conj
from fathom.bench import procs
from fathom.bench.report import dist
from fathom.client import Client
from fathom.host import iperf
from fathom.host.exec import argv
from fathom.lab.lab import Lab
from fathom.lab.ovs import wait_for
from fathom.lab.topology import parse

TOPOLOGY = """
networks:
  - {name: bench, type: vxlan, segmentation_id: 1401, cidr: 198.19.41.0/24, project: bench}
nodes:
  - name: c1
    vms:
      - {name: src, mac: "02:fe:00:00:41:0b", ip: 198.19.41.11/24, network: bench}
      - {name: dst1, mac: "02:fe:00:00:41:0c", ip: 198.19.41.12/24, network: bench}
  - name: c2
    vms:
      - {name: dst2, mac: "02:fe:00:00:41:15", ip: 198.19.41.21/24, network: bench}
"""
IPS = {"src": "198.19.41.11", "dst1": "198.19.41.12", "dst2": "198.19.41.21"}
PATHS = {"same_node": ("src", "dst1"), "cross_node": ("src", "dst2")}
NODES = {"same_node": ("c1",), "cross_node": ("c1", "c2")}
MODES = ("none", "sg1", "sg100")
GROUPS = {"sg1": 2, "sg100": 100}       # mode -> rules in its group
CONN_PORT = iperf.PORT                  # one ingress rule admits both tests
TARGET = 0.9
# ratio name -> (numerator mode, denominator mode)
RATIOS = {"sg1_over_none": ("sg1", "none"), "sg100_over_sg1": ("sg100", "sg1"), "sg100_over_none": ("sg100", "none")}
FIGURES = ("tcp_gbps", "connections_per_second")
# counter -> its line in `ovs-appctl dpif-netdev/pmd-stats-show`, once per datapath thread
COUNTERS = {"packets": "packets received", "recirculations": "packet recirculations", "emc_hits": "emc hits",
            "megaflow_hits": "megaflow hits", "upcalls": "miss with success upcall", "failed_upcalls": "miss with failed upcall",
            "subtables_per_megaflow_hit": "avg. subtable lookups per megaflow hit"}


def pmd_stats(text: str) -> dict:
    """The counters of `dpif-netdev/pmd-stats-show` summed over its threads (the main thread, PMDs),
    plus `subtable_lookups`: each thread's average per megaflow hit times its hits."""
    out = dict.fromkeys([*COUNTERS, "subtable_lookups"], 0.0)
    names = {v: k for k, v in COUNTERS.items()}
    for thread in re.split(r"^\S.*:\s*$", text, flags=re.M)[1:]:
        values = {names[m[0]]: float(m[1]) for m in re.findall(r"^\s+(.+?):\s+([\d.]+)", thread, flags=re.M)
                  if m[0] in names}
        for k, v in values.items():
            out[k] += v
        out["subtable_lookups"] += values.get("subtables_per_megaflow_hit", 0.0) * values.get("megaflow_hits", 0.0)
    return out


def group_rules(n: int) -> list[dict]:
    """The rules of a bench group of n rules: egress anywhere, ingress TCP CONN_PORT, and n - 2 ingress
    rules that match none of the bench's traffic."""
    rules = [{"direction": "egress"}, {"direction": "ingress", "protocol": "tcp", "port_range_min": CONN_PORT}]
    return rules + [{"direction": "ingress", "protocol": "tcp" if i % 2 else "udp", "port_range_min": 20000 + i,
                     "remote_ip_prefix": f"10.{i}.0.0/16"} for i in range(n - len(rules))]


SERVER = f"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {CONN_PORT}))
s.listen(4096)
while True:
    c, _ = s.accept()
    c.close()
"""
CLIENT = """
import socket, struct, sys, time
ip, seconds = sys.argv[1], float(sys.argv[2])
linger = struct.pack("ii", 1, 0)
done = failed = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
    s.settimeout(1.0)
    try:
        s.connect((ip, %d))
        done += 1
    except OSError:
        failed += 1
    s.close()
print(done, failed)
""" % CONN_PORT


class SecgroupsBench:
    def __init__(self, lab_name: str = "sgb", seconds: int = 5, repeats: int = 3, clients: int = 2,
                 progress=lambda msg: None):
        self.lab = Lab(lab_name)
        self.seconds, self.repeats, self.clients = seconds, repeats, clients
        self.progress = progress
        self.topo = parse(TOPOLOGY, "<bench secgroups>")

    # ------------------------------------------------------------------ modes
    def setup(self, api: Client) -> None:
        self.api = api
        self.ports = {p["name"]: p["id"] for p in api.get("/ports") if p["name"] in IPS}
        self.groups = {}
        for mode, n in GROUPS.items():
            group = api.post("/security-groups", json={"name": f"bench-{mode}", "project_id": "bench"})
            for r in group_rules(n):
                api.post("/security-group-rules", json={"security_group_id": group["id"], **r})
            self.groups[mode] = group["id"]

    def mode(self, name: str) -> None:
        """Put the three ports in mode `name` and wait until both br-ints show it: each port's ingress
        clause of its group's established flow, and none of another group's."""
        body = ({"port_security": False, "security_groups": []} if name == "none"
                else {"port_security": True, "security_groups": [self.groups[name]]})
        for pid in self.ports.values():
            self.api.patch(f"/ports/{pid}", json=body)

        def clause(pid: int, gid: int) -> str:
            return f"reg9={pid:#x} actions=conjunction({established_conj(gid)},1/2)"

        def shown() -> bool:
            for node in ("c1", "c2"):
                flows = self.lab.ovs(node).ofctl("dump-flows", "--no-stats", "br-int", "table=75")
                for vm, pid in self.ports.items():
                    if self.lab_node(vm) != node:
                        continue
                    for mode, gid in self.groups.items():
                        if (clause(pid, gid) in flows) != (mode == name):
                            return False
            return True
        wait_for(shown, timeout=60, what=f"mode {name} on the switches")
        time.sleep(1.0)

    def lab_node(self, vm: str) -> str:
        return next(n.name for n, v in self.topo.vms() if v.name == vm)

    # ------------------------------------------------------------------ measurements
    def measured(self, nodes: tuple[str, ...], run) -> tuple[object, dict]:
        """run(), and what the datapaths of `nodes` did meanwhile (`dpif-netdev/pmd-stats-show`, cleared
        before): passes per packet, misses sent up to the OpenFlow tables (upcalls), the share of
        lookups the exact-match cache answered, subtables probed per megaflow hit, ovs-vswitchd CPU
        per packet."""
        for node in nodes:
            self.lab.ovs(node).appctl("dpif-netdev/pmd-stats-clear")
        cpu = self.cpu_seconds(nodes)
        result = run()
        cpu = self.cpu_seconds(nodes) - cpu
        stats = [pmd_stats(self.lab.ovs(node).appctl("dpif-netdev/pmd-stats-show")) for node in nodes]
        c = {k: sum(s[k] for s in stats) for k in stats[0]}
        packets, hits = max(c["packets"], 1), c["megaflow_hits"]
        upcalls = c["upcalls"] + c["failed_upcalls"]
        lookups = max(c["emc_hits"] + hits + upcalls, 1)
        return result, {"packets": int(c["packets"]), "passes_per_packet": 1 + c["recirculations"] / packets,
                        "upcalls": int(upcalls), "emc_hit_share": c["emc_hits"] / lookups,
                        "subtables_per_megaflow_hit": c["subtable_lookups"] / hits if hits else 0.0,
                        "vswitchd_cpu_us_per_packet": cpu * 1e6 / packets}

    def cpu_seconds(self, nodes: tuple[str, ...]) -> float:
        return sum(procs.cpu_seconds(self.lab.ovs(n).pid("ovs-vswitchd")) or 0.0 for n in nodes)

    def throughput(self, src: str, dst: str) -> float:
        r = iperf.iperf3(self.lab.ns(src), self.lab.ns(dst), IPS[dst], seconds=self.seconds, omit=1)
        return r.gbps

    def connections(self, src: str, dst: str) -> dict:
        server = subprocess.Popen(argv(["python3", "-c", SERVER], self.lab.ns(dst)),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: self.listening(dst), timeout=10, what=f"the connection listener in {dst}")
            clients = [subprocess.Popen(argv(["python3", "-c", CLIENT, IPS[dst], str(self.seconds)],
                                              self.lab.ns(src)), stdout=subprocess.PIPE, text=True)
                       for _ in range(self.clients)]
            done = failed = 0
            for c in clients:
                out = c.communicate(timeout=self.seconds + 60)[0].split()
                done, failed = done + int(out[0]), failed + int(out[1])
        finally:
            server.kill()
            server.wait()
        return {"per_second": done / self.seconds, "failed": failed}

    def listening(self, vm: str) -> bool:
        return bool(self.lab.run(vm, "ss", "-Hltn", f"sport = :{CONN_PORT}").stdout.strip())

    # ------------------------------------------------------------------ run
    def run(self) -> dict:
        self.lab.down()
        try:
            self.progress("bringing up the lab")
            state = self.lab.up(self.topo, "<bench secgroups>")
            self.setup(Client.for_lab(state, timeout=60))
            keys = ("tcp_gbps", "tcp_datapath", "connections_per_second", "connections_failed", "connections_datapath")
            samples = {m: {p: {k: [] for k in keys} for p in PATHS} for m in MODES}
            for r in range(self.repeats):
                for m in (MODES if r % 2 == 0 else MODES[::-1]):     # interleaved, order alternating
                    self.mode(m)
                    for path, (src, dst) in PATHS.items():
                        self.progress(f"repeat {r + 1}/{self.repeats}: {m} {path}")
                        s = samples[m][path]
                        gbps, dp = self.measured(NODES[path], lambda: self.throughput(src, dst))
                        s["tcp_gbps"].append(gbps)
                        s["tcp_datapath"].append(dp)
                        c, dp = self.measured(NODES[path], lambda: self.connections(src, dst))
                        s["connections_per_second"].append(c["per_second"])
                        s["connections_failed"].append(c["failed"])
                        s["connections_datapath"].append(dp)
            return summary(samples, {"seconds": self.seconds, "repeats": self.repeats, "clients": self.clients})
        finally:
            self.lab.down()


def summary(samples: dict, parameters: dict) -> dict:
    """The results document from the samples: distributions per mode and path (the datapath figures
    per key), and the ratios of the medians."""
    def dists(s: dict) -> dict:
        out = {}
        for k, v in s.items():
            if v and isinstance(v[0], dict):
                out[k] = {f: dist([x[f] for x in v]) for f in v[0]}
            else:
                out[k] = dist(v)
        return out
    results = {m: {p: dists(s) for p, s in by.items()} for m, by in samples.items()}
    ratios = {name: {p: {k: results[a][p][k]["p50"] / results[b][p][k]["p50"] if results[b][p][k]["p50"] else None
                         for k in FIGURES} for p in PATHS}
              for name, (a, b) in RATIOS.items()}
    target = ratios["sg100_over_none"]
    return {"benchmark": "secgroups", "rules": {m: GROUPS.get(m, 0) for m in MODES}, "target_ratio": TARGET,
            "parameters": parameters, "results": results, "ratios": ratios,
            "meets_target": all(v is not None and v >= TARGET for r in target.values() for v in r.values())}


DATAPATH_COLUMNS = (("passes_per_packet", "{:.2f}"), ("upcalls", "{:.0f}"), ("emc_hit_share", "{:.2f}"),
                    ("subtables_per_megaflow_hit", "{:.2f}"), ("vswitchd_cpu_us_per_packet", "{:.1f}"))


def markdown(doc: dict) -> str:
    res, rat = doc["results"], doc["ratios"]
    lines = ["| path | figure | none | sg1 | sg100 | sg1 / none (conntrack) | sg100 / sg1 (rules) | sg100 / none |",
             "|---|---|---|---|---|---|---|---|"]

    def ratio(v):
        return "–" if v is None else f"{v:.2f}"
    for p in PATHS:
        for k, fmt in (("tcp_gbps", "{:.2f}"), ("connections_per_second", "{:.0f}")):
            cells = [fmt.format(res[m][p][k]["p50"]) for m in MODES]
            lines.append(f"| {p} | {k} | " + " | ".join(cells + [ratio(rat[n][p][k]) for n in RATIOS]) + " |")
    lines += ["", "What the datapaths did (medians over the nodes the path crosses; none · sg1 · sg100):", "",
              "| path | test | passes/packet | upcalls | EMC share | subtables/megaflow hit | vswitchd CPU µs/packet |",
              "|---|---|---|---|---|---|---|"]
    for p in PATHS:
        for test in ("tcp", "connections"):
            dp = [res[m][p][f"{test}_datapath"] for m in MODES]
            cells = [" · ".join(fmt.format(d[k]["p50"]) for d in dp) for k, fmt in DATAPATH_COLUMNS]
            lines.append(f"| {p} | {test} | " + " | ".join(cells) + " |")
    lines.append(f"\nmedians of {doc['parameters']['repeats']} interleaved repeats; target sg100 / none ≥ "
                 f"{doc['target_ratio']}: {'met' if doc['meets_target'] else 'NOT met'}")
    return "\n".join(lines) + "\n"
