"""ovs-vswitchd's CPU per GB carried at a fixed rate: what a feature costs the traffic itself, where a
throughput ratio cannot show it (`fathom bench flow-records`, `fathom bench trace --live --iperf`;
docs/benchmarks.md).

On this 2-core machine OVS's userspace datapath is CPU-bound and iperf3 runs at full speed differ
from one another by far more than a 1-3 % target, so a throughput ratio cannot resolve such a
target here. What can: the CPU the switches on the path spend per byte carried at a fixed rate
well below saturation (iperf3 TCP `-b`, so every mode carries the same bytes with CPU to spare),
with the feature off and on, interleaved over repeats. Where the datapath is CPU-bound, its
throughput is the CPU it has over the CPU it spends per byte, so off / on CPU per GB predicts the
on / off throughput ratio (`predicted_ratio`). That inference leaves out work not charged to
ovs-vswitchd (softirq work another context runs, e.g. a veth's receive backlog under ksoftirqd or
iperf3's own threads), what changes with the rate (a saturated datapath reads fuller batches,
usually cheaper per byte) and any bottleneck other than the datapath's CPU.

CPU: every thread's /proc/<pid>/task/<tid>/schedstat (ns on a CPU) of each ovs-vswitchd on the
path, read just before the iperf3 client starts and just after it ends, by thread kind: `main`
(in the userspace datapath it polls the non-PMD ports, veth here: forwarding, upcalls, sampling
and OpenFlow all run there), `pmd`, `handler`, `revalidator` and `other`. A thread that started in
the window counts from zero; one that ended in it is lost (OVS keeps its threads).
"""
from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Callable

from fathom.bench.report import dist
from fathom.bench.sfc import median_ci, verdict
from fathom.host import exec as host_exec
from fathom.host import iperf

KINDS = ("main", "pmd", "handler", "revalidator", "other")
RATE_MBPS, REPEATS, SECONDS, CI_LEVEL = 100, 6, 10, 0.95
HELD = 0.95          # a run holds its rate when the receiver counted at least this share of it


def kind(pid: int, tid: int, name: str) -> str:
    """The kind of an ovs-vswitchd thread by its name (`handler12`, `revalidator13`, `pmd-c00/id:4`). Pure."""
    if tid == pid:
        return "main"
    return next((k for k in ("pmd", "handler", "revalidator") if name.startswith(k)), "other")


def threads(pid: int) -> dict[int, tuple[str, int]]:
    """tid -> (kind, ns on a CPU) of every thread of a process (none when it is gone)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out[int(task.name)] = (kind(pid, int(task.name), (task / "comm").read_text().strip()),
                                   int((task / "schedstat").read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def sample(pids: dict[str, int]) -> dict[str, dict[int, tuple[str, int]]]:
    """switch name -> its threads' CPU, now."""
    return {name: threads(pid) for name, pid in pids.items()}


def cpu_ms(before: dict, after: dict) -> dict:
    """CPU ms between two `sample` readings, by switch and thread kind, by kind over the switches,
    and in total. A thread absent before counts from zero. Pure."""
    by_switch = {}
    for name, now in after.items():
        was = before.get(name, {})
        ms = {k: 0.0 for k in KINDS}
        for tid, (k, ns) in now.items():
            ms[k] += (ns - (was[tid][1] if tid in was else 0)) / 1e6
        by_switch[name] = ms
    by_kind = {k: sum(s[k] for s in by_switch.values()) for k in KINDS}
    return {"total": sum(by_kind.values()), "by_kind": by_kind, "by_switch": by_switch}


def per_gb(cpu: dict, nbytes: int) -> dict:
    """A `cpu_ms` reading per GB (10^9 bytes) carried: ms of CPU per GB, same shape. Pure."""
    f = 1e9 / nbytes if nbytes else float("nan")
    return {"total": cpu["total"] * f, "by_kind": {k: v * f for k, v in cpu["by_kind"].items()},
            "by_switch": {n: {k: v * f for k, v in s.items()} for n, s in cpu["by_switch"].items()}}


def run_at_rate(client_ns: str, server_ns: str, server_ip: str, pids: dict[str, int], rate_mbps: float,
                seconds: float, alongside: Callable[[Callable[[], bool]], dict] | None = None) -> dict:
    """One iperf3 TCP run at `rate_mbps` for `seconds`, with the switches' CPU over exactly the
    client's run. `alongside(running)`, when given, is called meanwhile in this thread (e.g. live
    traces back to back while `running()`); what it returns is kept as `alongside`."""
    got: list = []
    with iperf.server(server_ns, server_ip):
        before, t0 = sample(pids), time.perf_counter()

        def client():
            try:
                got.append(host_exec.run(iperf.client_args(server_ip, seconds=seconds, rate=f"{rate_mbps:g}M"),
                                         client_ns, timeout=seconds + 30))
            except Exception as e:          # noqa: BLE001 — raised below, in the caller's thread
                got.append(e)
        t = threading.Thread(target=client)
        t.start()
        extra = alongside(t.is_alive) if alongside else None
        t.join()
        after, wall = sample(pids), time.perf_counter() - t0
    if isinstance(got[0], Exception):
        raise got[0]
    r = iperf.parse(got[0].stdout, False)
    cpu = cpu_ms(before, after)
    out = {"gbps": r.gbps, "bytes": r.bytes, "retransmits": r.retransmits, "wall_s": wall,
           "rate_held": r.gbps * 1000 >= HELD * rate_mbps, "cpu_ms": cpu, "cpu_ms_per_gb": per_gb(cpu, r.bytes)}
    if extra is not None:
        out["alongside"] = extra
    return out


def compare(runs: list[dict], baseline: str, targets: dict[str, float], level: float = CI_LEVEL) -> dict:
    """Runs at a fixed rate (`{"mode", "repeat", "cpu_ms_per_gb": {"total": …}}`, every mode once
    per repeat) judged against `baseline`: per mode the CPU per GB, and per repeat the predicted
    throughput ratio baseline / mode (the mode's throughput against the baseline's where the
    datapath's CPU is the bottleneck) with the median's distribution-free interval and its verdict
    against the mode's target. The noise floor: |1 − off₂/off₁| of the baseline's consecutive
    repeats (nothing changed between them) and the baseline's spread ((max − min) / median); a
    target resolves when the floor's median is below 1 − target. Pure."""
    per: dict[str, dict[int, float]] = {}
    for r in runs:
        per.setdefault(r["mode"], {})[r["repeat"]] = r["cpu_ms_per_gb"]["total"]
    base = [per[baseline][i] for i in sorted(per.get(baseline, {}))]
    drift = [abs(1 - b / a) for a, b in zip(base, base[1:]) if a]
    floor = statistics.median(drift) if drift else None
    out = {"baseline": baseline, "cpu_ms_per_gb": {m: dist(list(v.values())) for m, v in per.items()},
           "noise_floor": {"off_off_change": drift, "median": floor, "max": max(drift) if drift else None,
                           "spread": (max(base) - min(base)) / statistics.median(base) if base else None},
           "runs_not_holding_rate": sum(1 for r in runs if not r.get("rate_held", True)), "modes": {}}
    for mode, target in targets.items():
        ratios = [per[baseline][i] / v for i, v in sorted(per.get(mode, {}).items()) if per[baseline].get(i) and v]
        ci = median_ci(ratios, level)
        resolves = floor is not None and floor < 1 - target
        out["modes"][mode] = {
            "predicted_ratios": ratios, "predicted_ratio": statistics.median(ratios) if ratios else None,
            "ci": ci, "ci_level": level, "target": target, "resolves": resolves,
            "verdict": verdict(ci, target) if resolves else "not resolved (noise floor)"}
    return out


def markdown(c: dict, what: str) -> list[str]:
    """The table of a `compare` result (`what` names the runs) and its noise floor line."""
    floor = c["noise_floor"]
    lines = [f"ovs-vswitchd CPU per GB carried at a fixed rate ({what}), the switches on the path:", "",
             "| mode | CPU ms per GB p50 | min | max | predicted throughput ratio (baseline / mode) | interval "
             "| target | verdict |", "|---|---|---|---|---|---|---|---|"]
    for mode, d in c["cpu_ms_per_gb"].items():
        m = c["modes"].get(mode)
        cells = ["–"] * 4 if m is None else [
            "–" if m["predicted_ratio"] is None else f"{m['predicted_ratio']:.4f}",
            "–" if m["ci"] is None else f"{m['ci'][0]:.4f}–{m['ci'][1]:.4f} ({m['ci'][2]:.0%})",
            f"≥ {m['target']}", m["verdict"]]
        lines.append(f"| {mode} | {d['p50']:.0f} | {d['min']:.0f} | {d['max']:.0f} | " + " | ".join(cells) + " |")
    lines += ["", f"Noise floor, |1 − off₂/off₁| of consecutive {c['baseline']} runs: "
              + ("–" if floor["median"] is None else
                 f"median {floor['median']:.4f}, max {floor['max']:.4f}; spread {floor['spread']:.4f}")
              + f". Runs that did not hold the rate: {c['runs_not_holding_rate']}."]
    return lines
