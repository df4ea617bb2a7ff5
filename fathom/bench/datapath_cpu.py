"""ovs-vswitchd's CPU per GB carried at a fixed rate: what a feature costs the traffic itself, where a
throughput ratio cannot show it (`fathom bench flow-records`, `fathom bench trace --live --iperf`;
docs/benchmarks.md).

On this 2-core machine OVS's userspace datapath is CPU-bound and iperf3 runs at full speed differ
from one another by far more than a 1-3 % target, so a throughput ratio cannot resolve such a
target here. What can: the CPU the switches on the path spend per byte carried at a fixed rate
well below saturation (iperf3 TCP `-b`, so every mode carries the same bytes with CPU to spare),
with the feature off and on, interleaved over repeats, and once per repeat with the feature off at
full speed (the datapath saturated). Where the datapath is CPU-bound its throughput is the CPU it
has over the CPU it spends per byte, so a feature adding A ms per GB to a saturated datapath's C
gives a throughput ratio C / (C + A) (`predicted_ratio`), and a target t allows A ≤ (1/t − 1) C.
A is measured at the fixed rate, C at full speed: at a low rate each wakeup carries fewer packets,
so the CPU per GB there is higher than C and a ratio taken at that rate alone would flatter the
feature. The inference assumes the feature's cost per byte is the same at both rates (true of a
cost per packet or per sampled packet, not of a cost per wakeup), and leaves out work not charged
to ovs-vswitchd (softirq work another context runs, e.g. a veth's receive backlog under ksoftirqd
or iperf3's own threads) and any bottleneck other than the datapath's CPU.

The shared machine moves CPU per byte by tens of per cent from one run to the next (contention,
caches, how many packets a wakeup finds). A switch on the path that the feature leaves alone (the
lab's fabric switch) forwards the same packets in the same window and moves alike, so `compare`
reads each run as the feature's switches' CPU over that control's.

CPU: every thread's /proc/<pid>/task/<tid>/schedstat (ns on a CPU) of each ovs-vswitchd on the
path, read just before the iperf3 client starts and just after it ends, by switch and thread
kind: `main` (in the userspace datapath it polls the non-PMD ports, veth here: forwarding,
upcalls, sampling and OpenFlow all run there), `pmd`, `handler`, `revalidator` and `other`. A
thread that started in the window counts from zero; one that ended in it is lost (OVS keeps its
threads).
"""
from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Callable

from fathom.bench.report import dist
from fathom.bench.sfc import median_ci
from fathom.host import exec as host_exec
from fathom.host import iperf

KINDS = ("main", "pmd", "handler", "revalidator", "other")
RATE_MBPS, REPEATS, SECONDS, CI_LEVEL = 40, 6, 10, 0.95
FULL_SPEED = "off, full speed"      # the mode name of the runs that measure the saturated datapath
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


def run_at_rate(client_ns: str, server_ns: str, server_ip: str, pids: dict[str, int], rate_mbps: float | None,
                seconds: float, alongside: Callable[[Callable[[], bool]], dict] | None = None) -> dict:
    """One iperf3 TCP run at `rate_mbps` (None: full speed) for `seconds`, with the switches' CPU over exactly the
    client's run. `alongside(running)`, when given, is called meanwhile in this thread (e.g. live
    traces back to back while `running()`); what it returns is kept as `alongside`."""
    got: list = []
    with iperf.server(server_ns, server_ip):
        before, t0 = sample(pids), time.perf_counter()

        def client():
            try:
                got.append(host_exec.run(iperf.client_args(server_ip, seconds=seconds, rate=rate_mbps and f"{rate_mbps:g}M"),
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
           "rate_held": rate_mbps is None or r.gbps * 1000 >= HELD * rate_mbps, "cpu_ms": cpu, "cpu_ms_per_gb": per_gb(cpu, r.bytes)}
    if extra is not None:
        out["alongside"] = extra
    return out


def on_switches(run: dict, switches: tuple[str, ...]) -> float:
    """A run's CPU ms per GB on the named switches together. Pure."""
    return sum(run["cpu_ms_per_gb"]["by_switch"][s][k] for s in switches for k in KINDS)


def compare(runs: list[dict], baseline: str, targets: dict[str, float], reference: str,
            switches: tuple[str, ...], control: str, level: float = CI_LEVEL) -> dict:
    """Runs (`{"mode", "repeat", "cpu_ms_per_gb": {"by_switch": …}}`, every mode once per repeat)
    judged against `baseline` (the feature off at the same fixed rate) on the feature's `switches`.

    The `control` switch forwards the same packets in the same window and the feature leaves it
    alone, so what the shared machine does to CPU per byte (contention, caches, how many packets a
    wakeup finds) moves it as it moves the others; each run is read as its switches' CPU over the
    control's (`controlled`), and a mode adds (controlled / the repeat's baseline's − 1) times the
    baseline's CPU per GB on the switches. Per mode: that per repeat, its median and
    distribution-free interval. A throughput target t on a CPU-bound datapath allows the switches
    (1/t − 1) times their CPU per GB at saturation (`reference`: the baseline's full-speed runs,
    median): the verdict is `shown` when the interval lies within that budget, `refuted` when above
    it; the predicted ratio is saturation / (saturation + added). The noise floor: what consecutive
    baseline repeats differ by (nothing changed between them), controlled and, for comparison,
    raw; a target resolves only when the controlled floor's median is below its budget. Pure."""
    per: dict[str, dict[int, dict]] = {}
    for r in runs:
        per.setdefault(r["mode"], {})[r["repeat"]] = r
    ctl = {m: {i: on_switches(r, switches) / on_switches(r, (control,)) for i, r in v.items()} for m, v in per.items()}
    raw = {m: {i: on_switches(r, switches) for i, r in v.items()} for m, v in per.items()}
    rate = statistics.median(raw[baseline].values()) if raw.get(baseline) else None
    sat = statistics.median(raw[reference].values()) if raw.get(reference) else None

    def floor(values: dict[int, float]) -> dict:
        seq = [values[i] for i in sorted(values)]
        rel = [abs(b / a - 1) for a, b in zip(seq, seq[1:]) if a]
        return {"off_off_change": rel, "median": statistics.median(rel) if rel else None,
                "max": max(rel) if rel else None,
                "spread": (max(seq) - min(seq)) / statistics.median(seq) if seq else None}
    noise = floor(ctl.get(baseline, {}))
    noise_ms = noise["median"] * rate if noise["median"] is not None and rate else None
    out = {"baseline": baseline, "reference": reference, "switches": list(switches), "control": control,
           "cpu_ms_per_gb": {m: dist(list(v.values())) for m, v in raw.items()},
           "controlled": {m: dist(list(v.values())) for m, v in ctl.items()},
           "rate_ms_per_gb": rate, "saturated_ms_per_gb": sat,
           "noise_floor": {**noise, "median_ms_per_gb": noise_ms, "raw": floor(raw.get(baseline, {}))},
           "runs_not_holding_rate": sum(1 for r in runs if not r.get("rate_held", True)), "modes": {}}
    for mode, target in targets.items():
        added = [(v / ctl[baseline][i] - 1) * rate for i, v in sorted(ctl.get(mode, {}).items())
                 if ctl[baseline].get(i)] if rate else []
        ci = median_ci(added, level)
        budget = (1 / target - 1) * sat if sat else None
        resolves = noise_ms is not None and budget is not None and noise_ms < budget
        mid = statistics.median(added) if added else None
        ratio = (lambda a: sat / (sat + a)) if sat else None
        out["modes"][mode] = {
            "added_ms_per_gb": added, "added_median": mid, "added_ci": ci, "ci_level": level,
            "target": target, "budget_ms_per_gb": budget,
            "predicted_ratio": ratio(mid) if ratio and mid is not None else None,
            "predicted_ratio_ci": (ratio(ci[1]), ratio(ci[0]), ci[2]) if ratio and ci else None,
            "resolves": resolves,
            "verdict": ("not resolved (noise floor)" if not resolves else "not resolved (too few repeats)"
                        if ci is None else "shown" if ci[1] <= budget else "refuted" if ci[0] > budget
                        else "not resolved")}
    return out


def markdown(c: dict, what: str) -> list[str]:
    """The table of a `compare` result (`what` names the runs) and its noise floor line."""
    floor = c["noise_floor"]
    sat = c["saturated_ms_per_gb"]
    lines = [f"ovs-vswitchd CPU per GB carried on {' + '.join(c['switches'])} ({what}); control switch "
             f"{c['control']}; at full speed (`{c['reference']}`) {'–' if sat is None else f'{sat:.0f}'} ms per GB:", "",
             "| mode | CPU ms/GB p50 | min | max | / control p50 | added ms/GB, median | interval "
             "| budget ms/GB (target) | predicted throughput ratio | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, d in c["cpu_ms_per_gb"].items():
        m = c["modes"].get(mode)
        cells = ["–"] * 5 if m is None else [
            "–" if m["added_median"] is None else f"{m['added_median']:+.0f}",
            "–" if m["added_ci"] is None else f"{m['added_ci'][0]:+.0f} – {m['added_ci'][1]:+.0f} ({m['ci_level']:.0%})",
            "–" if m["budget_ms_per_gb"] is None else f"{m['budget_ms_per_gb']:.0f} (≥ {m['target']})",
            "–" if m["predicted_ratio"] is None else f"{m['predicted_ratio']:.4f}"
            + ("" if m["predicted_ratio_ci"] is None else
               f" ({m['predicted_ratio_ci'][0]:.4f}–{m['predicted_ratio_ci'][1]:.4f})"),
            m["verdict"]]
        lines.append(f"| {mode} | {d['p50']:.0f} | {d['min']:.0f} | {d['max']:.0f} | {c['controlled'][mode]['p50']:.4f} | "
                     + " | ".join(cells) + " |")

    def fl(f):
        return "–" if f["median"] is None else f"median {f['median']:.2%}, max {f['max']:.2%}, spread {f['spread']:.2%}"
    lines += ["", f"Noise floor, consecutive {c['baseline']} runs |1 − off₂/off₁|: over the control {fl(floor)}"
              + ("" if floor["median_ms_per_gb"] is None else f" ({floor['median_ms_per_gb']:.0f} ms/GB)")
              + f"; raw {fl(floor['raw'])}. Runs that did not hold the rate: {c['runs_not_holding_rate']}."]
    return lines
