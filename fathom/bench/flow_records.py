"""`fathom bench flow-records`: what flow records cost and how fast and bounded they are
(docs/flow-records.md, docs/benchmarks.md).

One lab (two compute nodes, one VXLAN network, project `bench`): VM src on c1 sends to dst on c2
across the tunnel, both in the project's `default` security group. Four figures:

- throughput: iperf3 TCP src -> dst with sampling `off`, `every-port-1:100` (ingress, admit and
  drop at one in 100 for every port of the project) and `drops-1:1` (drops only, every one),
  interleaved over repeats (order alternating), as ratios of medians: every-port-1:100 / off
  (target >= 0.97) and drops-1:1 / off (target >= 0.99). Beside each ratio, whether the run can
  resolve it at all: the spread of the `off` runs ((max - min) / median) must be below 1 - target;
- delay: for every interval a node delivered, the controller's filing time minus the interval's
  end as the agent stamped it (one clock: the lab's nodes share the host's) — target <= 2 s;
- controller CPU per 10,000 records: valid records (src's port, its address, new 5-tuples) in
  batches as the agent packs them (fathom.model.flow_batch, its largest: BATCH records) posted
  through the API with c1's agent token, the controller process's CPU time (schedstat, every
  thread) over the posting minus its idle CPU over as long a window just after — target <= 50 ms;
- datapath cost (fathom.bench.datapath_cpu): what sampling costs the traffic itself, resolvable
  where the throughput ratios are not: iperf3 TCP src -> dst at a fixed rate well below saturation
  (`rate_mbps`) in the three modes, interleaved over repeats, and once per repeat `off` at full
  speed, with ovs-vswitchd's CPU per GB carried (c1's, the fabric's and c2's switches, by thread
  kind): the CPU per GB a mode adds over `off` on c1 and c2 (the fabric's switch, which sampling
  leaves alone, as the control), against what the target allows on a saturated CPU-bound
  datapath, beside the off/off noise floor;
- memory under a flood of new 5-tuples, in this process: IPFIX messages of new 5-tuples (1, 2 and
  5 times the limit) read by an agent collector (fathom.agent.flow_records) with its limit, and as
  many records filed into a controller's record store with its limit: the keys held never pass
  the limit, every one beyond it is counted as evicted, and the memory they hold (tracemalloc)
  stays flat.
"""
from __future__ import annotations

import gc
import time
import tracemalloc
from pathlib import Path

import httpx

from fathom.bench import datapath_cpu, procs
from fathom.bench.report import busy, dist, environment, machine_activity
from fathom.client import Client
from fathom.host import iperf
from fathom.lab.lab import Lab
from fathom.lab.ovs import wait_for
from fathom.lab.topology import parse
from fathom.model import flow_batch as fb
from fathom.model import flow_records as fr

TOPOLOGY = """
networks:
  - {name: bench, type: vxlan, segmentation_id: 1461, cidr: 198.19.46.0/24, project: bench}
nodes:
  - name: c1
    vms:
      - {name: src, mac: "02:fe:00:00:46:0b", ip: 198.19.46.11/24, network: bench}
  - name: c2
    vms:
      - {name: dst, mac: "02:fe:00:00:46:15", ip: 198.19.46.21/24, network: bench}
"""
IPS = {"src": "198.19.46.11", "dst": "198.19.46.21"}
NODE = {"src": "c1", "dst": "c2"}
# mode -> the project's rates (None: no row, sampling off)
MODES = {"off": None, "every-port-1:100": {"ingress": 100, "admit": 100, "drop": 100},
         "drops-1:1": {"ingress": 0, "admit": 0, "drop": 1}}
# ratio -> (mode, target)
TARGETS = {"every-port-1:100": 0.97, "drops-1:1": 0.99}
TARGET_DELAY_S = 2.0
TARGET_CPU_MS_PER_10K = 50.0
BATCH = fb.MAX_RECORDS      # the agent's batches (fathom.agent.flow_records) when it has that many


class FlowRecordsBench:
    def __init__(self, lab_name: str = "frb", seconds: int = 10, repeats: int = 5, cpu_trials: int = 5,
                 flood_limit: int = 20_000, rate_mbps: float = datapath_cpu.RATE_MBPS,
                 cost_repeats: int = datapath_cpu.REPEATS, cost_seconds: int = datapath_cpu.SECONDS,
                 progress=lambda msg: None):
        self.lab = Lab(lab_name)
        self.rate_mbps, self.cost_repeats, self.cost_seconds = rate_mbps, cost_repeats, cost_seconds
        self.seconds, self.repeats, self.cpu_trials, self.flood_limit = seconds, repeats, cpu_trials, flood_limit
        self.progress = progress
        self.topo = parse(TOPOLOGY, "<bench flow-records>")

    # ------------------------------------------------------------------ modes
    def mode(self, name: str) -> None:
        """Set the project's rates of mode `name` and wait until both br-ints carry exactly its samples."""
        rates = MODES[name]
        if rates is None:
            self.api.delete("/flow-records/config", params={"project_id": "bench"})
        else:
            self.api.request("PUT", "/flow-records/config", json={"project_id": "bench", **rates})

        def shown() -> bool:
            """Each port's ingress and drop samples there at the mode's probability, or absent."""
            for vm in IPS:
                flows = self.lab.ovs(NODE[vm]).ofctl("dump-flows", "--no-stats", "br-int")
                for kind, rate in ((fr.PORT_INGRESS, (rates or {}).get("ingress", 0)),
                                   (fr.DROP_EGRESS, (rates or {}).get("drop", 0))):
                    point = f"obs_domain_id={fr.OBS_DOMAIN},obs_point_id={fr.point_id(kind, self.ports[vm])})"
                    want = rate and f"sample(probability={fr.probability(rate)},collector_set_id={fr.COLLECTOR_SET},{point}"
                    if not ((want in flows) if want else (point not in flows)):
                        return False
            return True
        wait_for(shown, timeout=60, what=f"sampling mode {name} on the switches")
        time.sleep(1.0)

    def throughput(self) -> float:
        return iperf.iperf3(self.lab.ns("src"), self.lab.ns("dst"), IPS["dst"], seconds=self.seconds, omit=1).gbps

    def datapath_cost(self) -> list[dict]:
        """iperf3 src -> dst at the fixed rate in every mode, interleaved (order alternating), with
        the path's switches' CPU per GB carried."""
        pids = {n: self.lab.ovs(n).pid("ovs-vswitchd") for n in ("c1", "fabric", "c2")}
        runs = []
        for r in range(self.cost_repeats):
            for m in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
                self.mode(m)
                self.progress(f"datapath cost at {self.rate_mbps:g} Mb/s, repeat {r + 1}/{self.cost_repeats}: {m}")
                for mode, rate in ((m, self.rate_mbps),) + (((datapath_cpu.FULL_SPEED, None),) if m == "off" else ()):
                    runs.append({"mode": mode, "repeat": r, **datapath_cpu.run_at_rate(
                        self.lab.ns("src"), self.lab.ns("dst"), IPS["dst"], pids, rate, self.cost_seconds)})
        return runs

    # ------------------------------------------------------------------ delay
    def delays(self, since_s: float) -> list[float]:
        """Per interval (node, interval end) delivered in the last `since_s` seconds: when the
        controller filed its last record minus when the agent closed the interval."""
        records = self.api.get("/flow-records", params={"since": since_s, "limit": 1000,
                                                        "project": "bench"})["records"]
        filed: dict[tuple, float] = {}
        for r in records:
            key = (r["node"], r["interval_end"])
            filed[key] = max(filed.get(key, 0.0), r["time"])
        return [t - end for (_, end), t in filed.items()]

    # ------------------------------------------------------------------ controller CPU
    def ingest_cpu(self, state: dict) -> dict:
        """Controller CPU (ms) per 10,000 valid records posted through the API, idle CPU subtracted."""
        pid = state["controller"]["pid"]
        token = (Path(self.lab.node("c1").rundir) / "agent-token").read_text().strip()
        http = httpx.Client(base_url=state["controller"]["url"], timeout=60,
                            headers={"Authorization": f"Bearer {token}", "Content-Type": fb.CONTENT_TYPE})
        point = fr.point_id(fr.PORT_INGRESS, self.ports["src"])
        per_10k, idle_ms, wall = [], [], []
        n = 10_000        # the controller's burst of one node: no 429 within a trial
        try:
            for trial in range(self.cpu_trials):
                self.progress(f"controller CPU: trial {trial + 1}/{self.cpu_trials}")
                batches = [fb.encode([
                    {"point": point, "src": IPS["src"], "dst": IPS["dst"], "proto": 17,
                     "sport": 1024 + (trial * n + b * BATCH + i) % 60000, "dport": 9 + trial, "packets": 3,
                     "bytes": 4500, "first": time.time(), "last": time.time()} for i in range(BATCH)], time.time(), 5)
                    for b in range(n // BATCH)]
                time.sleep(2 * n / 5000.0)     # the node's token bucket full again (5000/s, burst 10000)
                c0, w0 = procs.schedstat_ns(pid), time.perf_counter()
                accepted = 0
                for body in batches:
                    r = http.post("/v1/flow-records/ingest", content=body)
                    r.raise_for_status()
                    accepted += r.json()["accepted"]
                busy_ns, busy_s = procs.schedstat_ns(pid) - c0, time.perf_counter() - w0
                if accepted != n:
                    raise RuntimeError(f"the controller kept {accepted} of {n} synthetic records")
                c0 = procs.schedstat_ns(pid)
                time.sleep(busy_s)           # as long, idle: what the controller spends anyway
                idle = procs.schedstat_ns(pid) - c0
                per_10k.append((busy_ns - idle) / 1e6 * 10_000 / n)
                idle_ms.append(idle / 1e6)
                wall.append(busy_s * 1000)
        finally:
            http.close()
        return {"records_per_trial": n, "cpu_ms_per_10k": dist(per_10k), "idle_cpu_ms_subtracted": dist(idle_ms),
                "wall_ms_per_trial": dist(wall)}

    # ------------------------------------------------------------------ run
    def run(self, cpu_only: bool = False) -> dict:
        """Every figure; with `cpu_only` the controller's CPU per 10,000 records alone."""
        self.lab.down()
        activity = [machine_activity((f"/{self.lab.name}/",))]
        try:
            self.progress("bringing up the lab")
            state = self.lab.up(self.topo, "<bench flow-records>")
            self.api = Client.for_lab(state, timeout=60)
            self.ports = {p["name"]: p["id"] for p in self.api.get("/ports") if p["name"] in IPS}
            if cpu_only:
                cpu = self.ingest_cpu(state)
                activity.append(machine_activity((f"/{self.lab.name}/",)))
                return {"benchmark": "flow-records", "part": "controller-cpu", "parameters": {
                    "cpu_trials": self.cpu_trials, "batch": BATCH},
                    "controller_cpu": {**cpu, "target_ms_per_10k": TARGET_CPU_MS_PER_10K},
                    "busy_machine": busy(activity), "environment": {**environment(), "machine": activity}}
            started = time.time()
            samples: dict[str, list[float]] = {m: [] for m in MODES}
            for r in range(self.repeats):
                for m in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
                    self.mode(m)
                    self.progress(f"repeat {r + 1}/{self.repeats}: {m}")
                    samples[m].append(self.throughput())
            cost = self.datapath_cost()
            self.mode("every-port-1:100")
            self.progress("waiting for the last intervals' records")
            time.sleep(12)       # two intervals: the last samples are delivered
            delays = self.delays(time.time() - started + 5)
            cpu = self.ingest_cpu(state)
        finally:
            self.lab.down()
        self.progress("memory under a flood of new 5-tuples")
        flood = memory_flood(self.flood_limit)
        activity.append(machine_activity((f"/{self.lab.name}/",)))
        return summary(samples, delays, cpu, flood, {
            "seconds": self.seconds, "repeats": self.repeats, "cpu_trials": self.cpu_trials,
            "flood_limit": self.flood_limit, "rate_mbps": self.rate_mbps, "cost_repeats": self.cost_repeats,
            "cost_seconds": self.cost_seconds}, activity, cost)


def memory_flood(limit: int, factors=(1, 2, 5)) -> dict:
    """Floods of new 5-tuples (factor x limit) into an agent's collector (as IPFIX messages, read and
    added up) and a controller's record store, each with `limit`: what they hold and count."""
    from fathom.agent.flow_records import FlowRecords
    from fathom.api.flow_export import messages
    from fathom.api.flow_records import RecordStore, file_records

    class NoHttp:
        def post(self, *a, **k):
            raise OSError("no controller in this measurement")

    point = fr.point_id(fr.PORT_INGRESS, 1)
    view = ({1: {"id": 1, "name": "src", "project": "bench", "network_id": 1, "ips": {"198.19.46.11"},
                 "groups": set()}}, {"198.19.46.11": 1}, {}, {}, {}, fr.SamplingIndex(()))
    out = {"agent": [], "controller": []}
    for factor in factors:
        n = factor * limit
        recs = [{"point": point, "src": "198.19.46.11", "dst": f"198.19.{46 + i // 60000 % 200}.21", "proto": 17,
                 "sport": 1024 + i % 60000, "dport": 53, "packets": 1, "bytes": 80, "first": 1.0, "last": 1.0}
                for i in range(n)]
        msgs = messages(recs, 0, 0)
        gc.collect()
        tracemalloc.start()
        collector = FlowRecords(NoHttp(), port=0, max_flows=limit)
        collector.sock.close()
        base = tracemalloc.get_traced_memory()[0]
        for m in msgs:
            collector.receive(m, "127.0.0.1", 1.0)
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        out["agent"].append({"new_5tuples": n, "limit": limit, "held": len(collector.agg.flows),
                             "evicted": collector.agg.counters["evicted"], "memory_mb": round(held / 2**20, 2)})
        store = RecordStore(env={"FATHOM_FLOW_RECORDS_MAX": str(limit)})
        batches = [fb.decode(fb.encode(recs[i:i + BATCH], 1.0, 5)) for i in range(0, n, BATCH)]
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        for batch in batches:       # filed as the controller files them: port 1 on c1 holds the source
            store.add(file_records("c1", batch, *view, {}))
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        out["controller"].append({"new_5tuples": n, "limit": limit, "held": len(store.records),
                                  "evicted": n - len(store.records), "memory_mb": round(held / 2**20, 2)})
    out["bounded"] = all(row["held"] <= limit and row["held"] + row["evicted"] == row["new_5tuples"]
                         for side in ("agent", "controller") for row in out[side])
    return out


def summary(samples: dict, delays: list[float], cpu: dict, flood: dict, parameters: dict, activity: list,
            cost: list[dict]) -> dict:
    results = {m: dist(v) for m, v in samples.items()}
    off = samples["off"]
    spread = (max(off) - min(off)) / results["off"]["p50"] if off and results["off"]["p50"] else None
    ratios = {}
    for m, target in TARGETS.items():
        ratio = results[m]["p50"] / results["off"]["p50"] if results["off"]["p50"] else None
        resolvable = spread is not None and spread < 1 - target
        ratios[m] = {"ratio": ratio, "target": target, "resolvable": resolvable,
                     "meets_target": None if not resolvable or ratio is None else ratio >= target}
    d = dist(delays) if delays else None
    return {"benchmark": "flow-records", "parameters": parameters,
            "throughput_gbps": results, "samples_gbps": samples, "off_spread": spread, "ratios": ratios,
            "delay_s": d, "intervals": len(delays), "target_delay_s": TARGET_DELAY_S,
            "controller_cpu": {**cpu, "target_ms_per_10k": TARGET_CPU_MS_PER_10K}, "flood": flood,
            "datapath_cost": {"rate_mbps": parameters["rate_mbps"], "seconds": parameters["cost_seconds"],
                              "runs": cost, **datapath_cpu.compare(cost, "off", TARGETS, datapath_cpu.FULL_SPEED,
                                                                      ("c1", "c2"), "fabric")},
            "busy_machine": busy(activity), "environment": {**environment(), "machine": activity}}


def cpu_line(doc: dict) -> str:
    c = doc["controller_cpu"]
    return (f"Controller CPU per 10,000 records (ingest through the API, idle subtracted): p50 "
            f"{c['cpu_ms_per_10k']['p50']:.1f} ms, max {c['cpu_ms_per_10k']['max']:.1f} ms over "
            f"{c['cpu_ms_per_10k']['n']} trials; target ≤ {c['target_ms_per_10k']:g} ms.")


def markdown(doc: dict) -> str:
    if doc.get("part") == "controller-cpu":
        return "\n".join(["# fathom bench flow-records --cpu-only", "", cpu_line(doc)]
                         + (["", "busy machine (load average above 1 or other labs running)"]
                            if doc["busy_machine"] else []) + [""])
    p = doc["parameters"]
    t = doc["throughput_gbps"]
    lines = [f"# fathom bench flow-records: {p['repeats']} interleaved repeats of {p['seconds']} s",
             "", "| sampling | TCP Gb/s p50 | min | max | / off | target | resolvable here |", "|---|---|---|---|---|---|---|"]
    for m in t:
        r = doc["ratios"].get(m)
        cells = ("–", "–", "–") if r is None else (
            "–" if r["ratio"] is None else f"{r['ratio']:.3f}", f"≥ {r['target']}", "yes" if r["resolvable"] else "no")
        lines.append(f"| {m} | {t[m]['p50']:.3f} | {t[m]['min']:.3f} | {t[m]['max']:.3f} | " + " | ".join(cells) + " |")
    spread = doc["off_spread"]
    lines += ["", f"Spread of the `off` runs (max - min) / median: {'–' if spread is None else f'{spread:.3f}'}; "
              "a ratio is resolvable when the spread is below 1 - its target."]
    c = doc["datapath_cost"]
    lines += ["", *datapath_cpu.markdown(c, f"iperf3 TCP at {c['rate_mbps']:g} Mb/s for {c['seconds']:g} s, "
                                            f"{p['cost_repeats']} interleaved repeats")]
    d = doc["delay_s"]
    lines += ["", "| delay, interval end → filed in the API | p50 | p99 | max | intervals | target |", "|---|---|---|---|---|---|",
              "| s | – | – | – | 0 | ≤ 2 |" if d is None else
              f"| s | {d['p50']:.3f} | {d['p99']:.3f} | {d['max']:.3f} | {doc['intervals']} | ≤ {doc['target_delay_s']:g} |"]
    lines += ["", cpu_line(doc)]
    f = doc["flood"]
    lines += ["", "| flood of new 5-tuples | limit | held | evicted | memory MB |", "|---|---|---|---|---|"]
    for side in ("agent", "controller"):
        for row in f[side]:
            lines.append(f"| {side}: {row['new_5tuples']} | {row['limit']} | {row['held']} | {row['evicted']} | "
                         f"{row['memory_mb']} |")
    lines += ["", f"bounded: {'yes' if f['bounded'] else 'NO'}"
              + ("; busy machine (load average above 1 or other labs running): figures are not publishable"
                 if doc["busy_machine"] else ""), ""]
    return "\n".join(lines)
