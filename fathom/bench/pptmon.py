"""`fathom bench pptmon`: the PPTMon paper's Figs 6-8 on the lab.

  fig6  processing time vs number of iptables rules, PPTMon against a capture reference
        (the same packets captured on the VNF's in0 and out0 with nanosecond timestamps);
        then the same comparison against the packet rate (500/s alone and in pairs,
        5000/s, 20000/s, and 500/s with one more capture on in0)
  fig7  iperf3 TCP throughput with PPTMon off and at 0.5 / 1 / 10 / 20 samples/s and
        every packet; per-packet program cost, also of a trivial TC program
  fig8  throughput of firewall / NAT / forwarder VNFs with PPTMon off and at 1 sample/s

Results go to results/pptmon/<stamp>/ (JSON, CSV, Markdown, PNG); with --docs the
Markdown and PNGs also replace the benchmark section of docs/pptmon.md and the raw JSON
and CSVs go to docs/benchmarks/pptmon/ beside it.
Run: sudo .venv/bin/python -m fathom.bench.pptmon [--quick] [--docs]
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import click

from fathom.host.iperf import iperf3
from fathom.pptmon import chain as chainmod
from fathom.pptmon import control, measure, native

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "pptmon.md"
IMG = ROOT / "docs" / "img"
RAW = ROOT / "docs" / "benchmarks" / "pptmon"
CHAINS = ("ppbf6", "ppbf7o", "ppbf7n", "ppbf80", "ppbf81", "ppbf82")
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:9]]
    return sum(vals) - vals[3] - vals[4], sum(vals)


def _iperf(c: chainmod.Chain, seconds: float, port: int = 5401, rate: str | None = None) -> float:
    """TCP throughput client -> server in Gb/s (receiver side); rate e.g. '1G' caps it."""
    return iperf3(c.client, c.server, c.server_ip, bind=False, port=port, seconds=seconds, rate=rate).gbps


def _set_rules(c: chainmod.Chain, k: int, rules: int) -> None:
    chainmod.run("iptables-restore", ns=c.vnf_ns(k), input=chainmod._firewall_rules(rules))


def _accuracy_run(c: chainmod.Chain, out: Path, tag: str, proto: str, extra_taps: int = 0,
                  **traffic) -> dict:
    """One traffic run with PPTMon on every packet and the capture reference on in0/out0;
    the per-packet comparison of measure.accuracy."""
    ns = c.vnf_ns(1)
    n0 = len(control.records(c.name))
    p_in, p_out = out / f"{tag}_in.pcap", out / f"{tag}_out.pcap"
    extra = [out / f"{tag}_tap{j}.pcap" for j in range(extra_taps)]
    with contextlib.ExitStack() as st:
        for p in extra:  # more captures on in0: their work lands in the reference's window
            st.enter_context(measure.capture(ns, "in0", p, proto))
        st.enter_context(measure.capture(ns, "in0", p_in, proto))
        st.enter_context(measure.capture(ns, "out0", p_out, proto))
        measure.transfer(c, proto, **traffic)
    time.sleep(0.3)
    recs = [r for r in control.records(c.name)[n0:] if r["flow"]["proto"] == proto]
    acc = measure.accuracy(recs, measure.timestamps(p_in, proto), measure.timestamps(p_out, proto))
    for p in [p_in, p_out, *extra]:
        p.unlink(missing_ok=True)
    return acc


def _flat_acc(acc: dict) -> dict:
    row = {"matched": acc["matched"]}
    for key, tag in (("pptmon", "pptmon"), ("reference", "ref"), ("ref_minus_pptmon", "diff"),
                     ("after_egress_stamp", "after_egress"), ("before_ingress_stamp", "before_ingress"),
                     ("ref_minus_pptmon_after_pause", "diff_after_pause"),
                     ("ref_minus_pptmon_right_after_another", "diff_right_after")):
        for st in ("count", "mean_us", "stddev_us", "p50_us", "p99_us", "min_us"):
            row[f"{tag}_{st}"] = acc.get(key, {}).get(st)
    return row


def fig6(out: Path, rules_list: list[int], packets: int) -> list[dict]:
    name = "ppbf6"
    c = chainmod.Chain(name=name, vnfs=[chainmod.Vnf("firewall", 0)], base=60, offloads=False)
    control.down(name)
    chainmod.up(c)
    rows = []
    try:
        control.enable(name, period_ns=0)
        for proto in ("udp", "tcp"):
            for rules in rules_list:
                _set_rules(c, 1, rules)
                traffic = (dict(count=packets, rate=500, size=[200]) if proto == "udp"
                           else dict(bytes=packets * 150))
                acc = _accuracy_run(c, out, f"f6_{proto}_{rules}", proto, **traffic)
                row = {"proto": proto, "rules": rules, **_flat_acc(acc)}
                rows.append(row)
                click.echo(f"fig6 {proto} rules={rules}: pptmon {row['pptmon_mean_us']:.1f} µs, "
                           f"capture {row['ref_mean_us']:.1f} µs, diff {row['diff_mean_us']:.2f} µs "
                           f"(before ingress {row['before_ingress_mean_us']:.2f}, after egress "
                           f"{row['after_egress_mean_us']:.2f})", err=True)
    finally:
        control.down(name)
    return rows


# (label, UDP traffic, captures added on in0): the rate study of the accuracy section
RATE_STUDY = [
    ("500/s", dict(count=1000, rate=500), 0),
    ("500 pairs/s", dict(count=2000, rate=500, burst=2), 0),
    ("5000/s", dict(count=5000, rate=5000), 0),
    ("20000/s", dict(count=10000, rate=20000), 0),
]
TAP_REPS = 3   # 500/s without and with one more capture on in0, interleaved


def fig6_rates(out: Path, quick: bool) -> list[dict]:
    """Capture minus PPTMon against the packet rate: firewall with no rules, 200-byte UDP,
    every packet marked.  Splits the difference at PPTMon's stamps and, with pairs, into
    the packet after a pause and the one right behind it."""
    name = "ppbf6"
    c = chainmod.Chain(name=name, vnfs=[chainmod.Vnf("firewall", 0)], base=60, offloads=False)
    control.down(name)
    chainmod.up(c)
    rows = []
    try:
        control.enable(name, period_ns=0)
        for label, traffic, taps in RATE_STUDY:
            traffic = dict(traffic)
            if quick:
                traffic["count"] = min(traffic["count"], 600)
            acc = _accuracy_run(c, out, "rate", "udp", extra_taps=taps, size=[200], **traffic)
            row = {"setting": label, "rate": traffic["rate"], "burst": traffic.get("burst", 1),
                   "extra_taps": taps, **_flat_acc(acc)}
            rows.append(row)
            click.echo(f"fig6 rates {label}: diff {row['diff_mean_us']:.2f} µs (before ingress "
                       f"{row['before_ingress_mean_us']:.2f}, after egress {row['after_egress_mean_us']:.2f})",
                       err=True)
        # the capture's own work lies in its window: add a second capture on in0
        for rep in range(1 if quick else TAP_REPS):
            for taps in (0, 1):
                acc = _accuracy_run(c, out, "taps", "udp", extra_taps=taps, size=[200],
                                    count=600 if quick else 1000, rate=500)
                label = "500/s" + (", one more capture on in0" if taps else "") + f" (run {rep + 1})"
                rows.append({"setting": label, "rate": 500, "burst": 1, "extra_taps": taps,
                             **_flat_acc(acc)})
                click.echo(f"fig6 rates {label}: before ingress "
                           f"{rows[-1]['before_ingress_mean_us']:.2f} µs", err=True)
    finally:
        control.down(name)
    return rows


RATES = [("off", None), ("0.5/s", 2 * 10**9), ("1/s", 10**9), ("10/s", 10**8), ("20/s", 5 * 10**7),
         ("every packet", 0)]


def _prog_totals(pids: list[int]) -> dict[str, tuple[int, int]]:
    """{program name: (run_cnt, run_time_ns)} summed over the loaded PPTMon programs
    (bpftool 7.1 here does not list owner pids: run the benchmark alone)."""
    p = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True)
    out: dict[str, tuple[int, int]] = {}
    for prog in json.loads(p.stdout or "[]"):
        name = prog.get("name")
        if name not in ("ppt_in", "ppt_out"):
            continue
        owners = [x.get("pid") for x in prog.get("pids", [])]
        if owners and not any(pid in pids for pid in owners):
            continue
        cnt, ns = out.get(name, (0, 0))
        out[name] = (cnt + prog.get("run_cnt", 0), ns + prog.get("run_time_ns", 0))
    return out


def _cost(name: str, c: chainmod.Chain, seconds: float) -> dict:
    """Mean run time of our programs per packet during an iperf3 run (kernel BPF stats)."""
    pids = control.state(c)["pids"]
    subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"], check=True)
    try:
        a = _prog_totals(pids)
        gbps = _iperf(c, seconds)
        b = _prog_totals(pids)
    finally:
        subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"], check=True)
    res = {"gbps_with_stats": gbps}
    for prog in ("ppt_in", "ppt_out"):
        dc = b.get(prog, (0, 0))[0] - a.get(prog, (0, 0))[0]
        dn = b.get(prog, (0, 0))[1] - a.get(prog, (0, 0))[1]
        res[f"{prog}_pkts"] = dc
        res[f"{prog}_ns_per_pkt"] = dn / dc if dc else None
        res[f"{prog}_cpu_share"] = dn / (seconds * 1e9)
    return res


def _prog_by_id(prog_id: int) -> tuple[int, int]:
    p = subprocess.run(["bpftool", "prog", "show", "id", str(prog_id), "-j"], capture_output=True,
                       text=True)
    info = json.loads(p.stdout or "{}")
    return info.get("run_cnt", 0), info.get("run_time_ns", 0)


def _trivial_cost(c: chainmod.Chain, seconds: float) -> dict:
    """The same run-time statistics for a trivial TC program (one atomic add and return:
    native/pptmon/testpass.bpf.c) at PPTMon's two hooks, with PPTMon off: what any
    program costs there, statistics included."""
    ns, obj = c.vnf_ns(1), str(native.BUILD / "testpass.bpf.o")
    hooks = (("in0", "ingress"), ("out0", "egress"))
    ids = {}
    for dev, where in hooks:
        chainmod.run("tc", "qdisc", "add", "dev", dev, "clsact", ns=ns, check=False)
        chainmod.run("tc", "filter", "add", "dev", dev, where, "pref", "7", "bpf", "da", "obj", obj,
                     "sec", "tc", ns=ns)
        shown = chainmod.run("tc", "filter", "show", "dev", dev, where, ns=ns).stdout
        ids[dev] = int(re.search(r"\bid (\d+)", shown).group(1))
    subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=1"], check=True)
    try:
        a = {dev: _prog_by_id(i) for dev, i in ids.items()}
        _iperf(c, seconds)
        b = {dev: _prog_by_id(i) for dev, i in ids.items()}
    finally:
        subprocess.run(["sysctl", "-qw", "kernel.bpf_stats_enabled=0"], check=True)
        for dev, where in hooks:
            chainmod.run("tc", "filter", "del", "dev", dev, where, "pref", "7", ns=ns, check=False)
    res = {}
    for dev, tag in (("in0", "in"), ("out0", "out")):
        cnt, t = b[dev][0] - a[dev][0], b[dev][1] - a[dev][1]
        res[f"trivial_{tag}_pkts"] = cnt
        res[f"trivial_{tag}_ns_per_pkt"] = t / cnt if cnt else None
    return res


def fig7(seconds: float, reps: int, offloads: bool) -> list[dict]:
    name = "ppbf7" + ("o" if offloads else "n")
    c = chainmod.Chain(name=name, vnfs=[chainmod.Vnf("firewall", 0)], base=70, offloads=offloads)
    control.down(name)
    chainmod.up(c)
    rows = []
    try:
        results: dict[str, list[float]] = {label: [] for label, _ in RATES}
        order = list(RATES)
        rnd = random.Random(7)
        for _ in range(reps):  # interleave settings, in a new order each round
            rnd.shuffle(order)
            for label, period in order:
                if period is None:
                    control.disable(name, missing_ok=True)
                else:
                    control.enable(name, period_ns=period)
                results[label].append(_iperf(c, seconds))
        # CPU time per byte at a fixed offered load: far steadier than peak throughput
        cpu: dict[str, list[float]] = {label: [] for label, _ in RATES}
        for _ in range(max(2, reps - 2)):
            rnd.shuffle(order)
            for label, period in order:
                if period is None:
                    control.disable(name, missing_ok=True)
                else:
                    control.enable(name, period_ns=period)
                b0, t0 = _cpu_jiffies()
                gbps = _iperf(c, seconds, rate="1G")
                b1, t1 = _cpu_jiffies()
                cpus = (os.cpu_count() or 1) * (b1 - b0) / max(1, t1 - t0)
                wall = seconds + 0.3
                cpu[label].append(cpus * wall / (gbps * seconds / 8))  # CPU-s per GB
        costs: dict[str, dict] = {}
        for label, period in RATES:  # a separate pass: BPF run-time stats cost a little
            if period is not None:
                control.enable(name, period_ns=period)
                costs[label] = _cost(name, c, min(seconds, 3.0))
        control.disable(name, missing_ok=True)
        costs["off"] = _trivial_cost(c, min(seconds, 3.0))
        base = statistics.mean(results["off"])
        for label, period in RATES:
            v = results[label]
            sem = statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else 0.0
            rows.append({"offloads": offloads, "setting": label, "period_ns": period,
                         "gbps_mean": statistics.mean(v),
                         "gbps_std": statistics.stdev(v) if len(v) > 1 else 0.0,
                         "gbps_sem": sem,
                         "ratio_vs_off": statistics.mean(v) / base, "runs": v,
                         "cpu_s_per_gb": statistics.mean(cpu[label]),
                         "cpu_s_per_gb_std": statistics.stdev(cpu[label]) if len(cpu[label]) > 1 else 0.0,
                         "cpu_ratio_vs_off": statistics.mean(cpu[label]) / statistics.mean(cpu["off"]),
                         "cpu_runs": cpu[label],
                         **costs.get(label, {})})
            cst = costs.get(label, {})
            click.echo(f"fig7 offloads={offloads} {label}: {statistics.mean(v):.2f} Gb/s "
                       f"({statistics.mean(v) / base:.3f} of off); per packet "
                       f"in {cst.get('ppt_in_ns_per_pkt') or 0:.0f} ns, "
                       f"out {cst.get('ppt_out_ns_per_pkt') or 0:.0f} ns", err=True)
    finally:
        control.down(name)
    return rows


def fig8(seconds: float, reps: int) -> list[dict]:
    rows = []
    for i, (kind, rules) in enumerate((("firewall", 20), ("nat", 0), ("forward", 0))):
        name = f"ppbf8{i}"
        c = chainmod.Chain(name=name, vnfs=[chainmod.Vnf(kind, rules)], base=80 + 2 * i)
        control.down(name)
        chainmod.up(c)
        try:
            off, on = [], []
            for r in range(reps):  # alternate which setting goes first
                for setting in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    if setting == "off":
                        control.disable(name, missing_ok=True)
                        off.append(_iperf(c, seconds))
                    else:
                        control.enable(name, period_ns=10**9)
                        on.append(_iperf(c, seconds))
            control.disable(name, missing_ok=True)
            row = {"vnf": chainmod.Vnf(kind, rules).label(), "off_gbps": statistics.mean(off),
                   "on_gbps": statistics.mean(on), "ratio": statistics.mean(on) / statistics.mean(off),
                   "off_runs": off, "on_runs": on}
            rows.append(row)
            click.echo(f"fig8 {row['vnf']}: off {row['off_gbps']:.2f}, 1/s {row['on_gbps']:.2f} Gb/s "
                       f"({row['ratio']:.3f})", err=True)
        finally:
            control.down(name)
    return rows


# ---- reporting -------------------------------------------------------------------------

def _plots(out: Path, f6: list[dict], f7: list[dict], f8: list[dict]) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    if f6:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
        for ax, proto in zip(axes, ("tcp", "udp")):
            rs = [r for r in f6 if r["proto"] == proto and r["matched"]]
            x = [r["rules"] for r in rs]
            ax.errorbar(x, [r["pptmon_mean_us"] for r in rs], yerr=[r["pptmon_stddev_us"] for r in rs],
                        marker="o", capsize=3, label="PPTMon")
            ax.errorbar(x, [r["ref_mean_us"] for r in rs], yerr=[r["ref_stddev_us"] for r in rs],
                        marker="s", capsize=3, label="capture (tcpdump, ns)")
            ax.set_title(proto.upper())
            ax.set_xlabel("iptables rules")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("processing time (µs)")
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(out / "pptmon_fig6.png", dpi=110)
        names.append("pptmon_fig6.png")
    if f7:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for off in sorted({r["offloads"] for r in f7}, reverse=True):
            rs = [r for r in f7 if r["offloads"] == off]
            ax.errorbar(range(len(rs)), [r["gbps_mean"] for r in rs], yerr=[r["gbps_std"] for r in rs],
                        marker="o", capsize=3, label=f"offloads {'on' if off else 'off'}")
            ax.set_xticks(range(len(rs)), [r["setting"] for r in rs])
        ax.set_ylabel("iperf3 TCP (Gb/s)")
        ax.set_xlabel("PPTMon sampling")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "pptmon_fig7.png", dpi=110)
        names.append("pptmon_fig7.png")
    if f8:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        x = range(len(f8))
        ax.bar([i - 0.2 for i in x], [r["off_gbps"] for r in f8], 0.4, label="PPTMon off")
        ax.bar([i + 0.2 for i in x], [r["on_gbps"] for r in f8], 0.4, label="PPTMon 1 sample/s")
        ax.set_xticks(list(x), [r["vnf"] for r in f8])
        ax.set_ylabel("iperf3 TCP (Gb/s)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "pptmon_fig8.png", dpi=110)
        names.append("pptmon_fig8.png")
    plt.close("all")
    return names


def _commit() -> str:
    """The checked-out commit, read from the repository's files ("" if there is none): a
    worktree's .git file names its git directory, whose commondir holds the branches."""
    git = ROOT / ".git"
    try:
        if git.is_file():
            git = (ROOT / git.read_text().split(":", 1)[1].strip()).resolve()
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        common = (git / (git / "commondir").read_text().strip()).resolve() \
            if (git / "commondir").exists() else git
        for d in (git, common):
            if (d / ref).exists():
                return (d / ref).read_text().strip()
        for line in (common / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except (OSError, IndexError):
        pass
    return ""


def _machine() -> dict:
    """What the run shared the machine with: load and other labs' namespaces and switches."""
    try:
        netns = os.listdir("/run/netns")
    except FileNotFoundError:
        netns = []
    from fathom.bench.report import foreign_vswitchd
    return {"loadavg": [round(x, 2) for x in os.getloadavg()],
            "other_netns": len([n for n in netns if not n.startswith(CHAINS)]),
            "other_ovs_vswitchd": foreign_vswitchd()}


def _run_header(fig: dict) -> list[str]:
    env, a, b = fig["env"], fig["machine_at_start"], fig["machine_at_end"]
    load = lambda m: "/".join(f"{x:.1f}" for x in m["loadavg"])  # noqa: E731
    return [f"Command: `{fig['command']}` (commit {env.get('commit', '?')[:12]})  ",
            f"Run: {env['time']}, {fig['elapsed_s']:.0f} s — kernel {env['kernel']}, {env['cpus']} CPUs. "
            f"Shared machine: load average {load(a)} at the start, {load(b)} at the end; "
            f"{a['other_netns']} network namespaces and {a['other_ovs_vswitchd']} ovs-vswitchd of "
            f"other labs were present. Raw data: [{fig['raw']}](benchmarks/pptmon/{fig['raw']}).", ""]


def _md_fig6(fig: dict, img: str) -> list[str]:
    f6, rates = fig["rows"], fig.get("rates", [])
    L = ["### Fig. 6 — processing time vs iptables rules (PPTMon vs capture)", ""] + _run_header(fig) + [
        "Every packet marked (`--period 0`), 500 packets/s of 200-byte UDP datagrams or a "
        "paced TCP stream; one firewall VNF, offloads off; PPTMon and the reference are "
        "compared **per packet** (same IP ID / TCP sequence number on in0 and out0). The "
        "difference is split at PPTMon's stamps with the sink record's egress time: the part "
        "before PPTMon's ingress stamp (receive queue, the capture's own tap, the start of TC "
        "ingress) and the part after its egress stamp (to the transmit tap).", "",
        f"![fig6]({img}/pptmon_fig6.png)", "",
        "| proto | rules | packets | PPTMon mean ± sd (µs) | capture mean ± sd (µs) | "
        "capture − PPTMon mean / p50 / min (µs) | before ingress / after egress, mean (µs) |",
        "|---|---|---|---|---|---|---|"]
    for r in f6:
        if not r["matched"]:
            continue
        L.append(f"| {r['proto']} | {r['rules']} | {r['matched']} | {r['pptmon_mean_us']:.1f} ± "
                 f"{r['pptmon_stddev_us']:.1f} | {r['ref_mean_us']:.1f} ± {r['ref_stddev_us']:.1f} | "
                 f"{r['diff_mean_us']:.2f} / {r['diff_p50_us']:.2f} / {r['diff_min_us']:.2f} | "
                 f"{r['before_ingress_mean_us']:.2f} / {r['after_egress_mean_us']:.2f} |")
    diffs = {p: [r["diff_mean_us"] for r in f6 if r["proto"] == p and r["matched"]]
             for p in ("tcp", "udp")}
    L += ["", "Mean difference over all rule counts: " + ", ".join(
        f"{p.upper()} {statistics.mean(v):.2f} µs (sd {statistics.pstdev(v):.2f})"
        for p, v in diffs.items() if v) + " (paper: TCP 6.5 µs, UDP 3.8 µs).", ""]
    if rates:
        L += ["Against the packet rate (firewall, no rules, 200-byte UDP, every packet marked; "
              "\"pairs\": two datagrams back to back every 2 ms, the second one reaches a path "
              "the first has just warmed):", "",
              "| UDP | packets | PPTMon mean (µs) | capture − PPTMon mean / p50 / min (µs) | "
              "before ingress / after egress (µs) | after a pause / right behind another, mean (packets) |",
              "|---|---|---|---|---|---|"]
        for r in rates:
            pause = " / ".join(
                "–" if r.get(f"{k}_mean_us") is None else f"{r[f'{k}_mean_us']:.2f} ({r[f'{k}_count']})"
                for k in ("diff_after_pause", "diff_right_after"))
            L.append(f"| {r['setting']} | {r['matched']} | {r['pptmon_mean_us']:.2f} | "
                     f"{r['diff_mean_us']:.2f} / {r['diff_p50_us']:.2f} / {r['diff_min_us']:.2f} | "
                     f"{r['before_ingress_mean_us']:.2f} / {r['after_egress_mean_us']:.2f} | {pause} |")
        L.append("")
        taps = {k: [r["before_ingress_mean_us"] for r in rates if r["setting"].startswith("500/s")
                    and "(run" in r["setting"] and r["extra_taps"] == k] for k in (0, 1)}
        if taps[0] and taps[1]:
            L += [f"The part before PPTMon's ingress stamp with one capture on in0 (the "
                  f"reference's) and with a second one added, runs interleaved ({len(taps[0])} "
                  f"each, 500/s): {statistics.mean(taps[0]):.2f} µs (runs: "
                  f"{', '.join(f'{x:.2f}' for x in taps[0])}) and {statistics.mean(taps[1]):.2f} µs "
                  f"({', '.join(f'{x:.2f}' for x in taps[1])}).", ""]
    return L


def _md_fig7(fig: dict, img: str) -> list[str]:
    f7 = fig["rows"]
    L = ["### Fig. 7 — throughput vs sampling rate", ""] + _run_header(fig) + [
        "One VNF (firewall, no rules), iperf3 TCP; settings interleaved, mean ± sd over "
        "the runs.", "", f"![fig7]({img}/pptmon_fig7.png)", "",
        "Peak throughput of one run varies by 10-30 % on this 2-CPU VM (client, server "
        "and all packet work share two CPUs), far more than the effect at low sampling "
        "rates, so two other measures follow: CPU time (all CPUs, /proc/stat: the whole machine, "
        "other labs included) per GB transferred at a fixed 1 Gb/s, and the mean run time of our two programs per "
        "packet from the kernel's BPF run statistics (separate runs; the statistics "
        "themselves add a few tens of ns per run, so these are upper bounds) with the "
        "share of one CPU they used. The row \"off\" gives the same statistics for a trivial "
        "TC program at the same two hooks (`testpass.bpf.o`: one atomic add).", "",
        "| offloads | PPTMon | peak Gb/s (mean ± sd) | peak ratio to off | CPU-s per GB at 1 Gb/s "
        "(mean ± sd) | CPU ratio to off | ns/packet in + out | CPU share of programs |",
        "|---|---|---|---|---|---|---|---|"]
    for r in f7:
        cost = share = ""
        if r.get("ppt_in_ns_per_pkt") is not None:
            cost = f"{r['ppt_in_ns_per_pkt']:.0f} + {r['ppt_out_ns_per_pkt'] or 0:.0f}"
            share = f"{100 * (r['ppt_in_cpu_share'] + r['ppt_out_cpu_share']):.2f} %"
        elif r.get("trivial_in_ns_per_pkt") is not None:
            cost = (f"trivial program: {r['trivial_in_ns_per_pkt']:.0f} + "
                    f"{r['trivial_out_ns_per_pkt'] or 0:.0f}")
        L.append(f"| {'on' if r['offloads'] else 'off'} | {r['setting']} | {r['gbps_mean']:.2f} ± "
                 f"{r['gbps_std']:.2f} | {r['ratio_vs_off']:.3f} | {r['cpu_s_per_gb']:.3f} ± "
                 f"{r['cpu_s_per_gb_std']:.3f} | {r['cpu_ratio_vs_off']:.3f} | {cost} | {share} |")
    L.append("")
    return L


def _md_fig8(fig: dict, img: str) -> list[str]:
    L = ["### Fig. 8 — throughput per VNF kind, PPTMon off vs 1 sample/s", ""] + _run_header(fig) + [
        "iperf3 TCP through one VNF, the two settings alternating; every run is listed: the "
        "spread between runs of one setting is larger than any effect of sampling once a "
        "second.", "",
        f"![fig8]({img}/pptmon_fig8.png)", "",
        "| VNF | off (Gb/s), mean [runs] | 1/s (Gb/s), mean [runs] | ratio of means |",
        "|---|---|---|---|"]
    for r in fig["rows"]:
        runs = lambda v: ", ".join(f"{x:.1f}" for x in v)  # noqa: E731
        L.append(f"| {r['vnf']} | {r['off_gbps']:.2f} [{runs(r['off_runs'])}] | {r['on_gbps']:.2f} "
                 f"[{runs(r['on_runs'])}] | {r['ratio']:.3f} |")
    L.append("")
    return L


def _markdown(figs: dict, img: str) -> str:
    L = [BEGIN, ""]
    for key, fn in (("fig6", _md_fig6), ("fig7", _md_fig7), ("fig8", _md_fig8)):
        if figs.get(key):
            L += fn(figs[key], img)
    L.append(END)
    return "\n".join(L)


def _write_csv(path: Path, rows: list[dict]) -> None:
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols and not k.endswith("runs")]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


@click.command("pptmon")
@click.option("--figs", default="6,7,8", show_default=True,
              help="which figures to run; 'none' with --docs rewrites the section from the raw "
                   "data already in docs/benchmarks/pptmon/")
@click.option("--quick", is_flag=True, help="fewer points, shorter runs (a smoke run)")
@click.option("--seconds", default=4.0, show_default=True, help="iperf3 run length")
@click.option("--reps", default=3, show_default=True, help="repetitions per throughput point")
@click.option("--docs", is_flag=True, help="also put the figures, their raw data and their section "
              "into docs/ (figures not run keep theirs)")
@click.option("--out", "out_dir", default=None, help="results directory")
def bench_pptmon(figs, quick, seconds, reps, docs, out_dir):
    """Reproduce the PPTMon paper's Figs 6-8 (PPTMon accuracy and overhead) on the lab."""
    want = set() if figs == "none" else {int(x) for x in figs.split(",") if x.strip()}
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(out_dir) if out_dir else ROOT / "results" / "pptmon" / stamp
    out.mkdir(parents=True, exist_ok=True)
    if quick:
        seconds, reps = 2.0, 1
    rules = [0, 100, 500] if quick else [0, 100, 500, 1000, 2000]
    if Path(sys.argv[0]).name == "fathom":
        cmd = "sudo .venv/bin/fathom " + " ".join(sys.argv[1:])
    else:
        cmd = "sudo .venv/bin/python -m fathom.bench.pptmon" + "".join(" " + a for a in sys.argv[1:])
    commit = _commit()
    env = {**measure.env(), "time": stamp, "commit": commit}
    runners = {
        "fig6": lambda: {"rows": fig6(out, rules, 300 if quick else 1000),
                         "rates": fig6_rates(out, quick)},
        "fig7": lambda: {"rows": fig7(seconds, reps, offloads=False) + fig7(seconds, reps, offloads=True)},
        "fig8": lambda: {"rows": fig8(seconds, reps)},
    }
    done: dict[str, dict] = {}
    for key, run in runners.items():
        if int(key[3:]) not in want:
            continue
        m0, t0 = _machine(), time.monotonic()
        fig = run()
        fig.update(env=env, command=cmd, quick=quick, machine_at_start=m0,
                   machine_at_end=_machine(), elapsed_s=time.monotonic() - t0, raw=f"{key}.json")
        done[key] = fig
        (out / f"{key}.json").write_text(json.dumps(fig, indent=2))
        _write_csv(out / f"{key}.csv", fig["rows"])
        if fig.get("rates"):
            _write_csv(out / f"{key}_rates.csv", fig["rates"])
    names = _plots(out, *(done.get(k, {}).get("rows", []) for k in ("fig6", "fig7", "fig8")))
    (out / "pptmon.md").write_text(_markdown(done, "img").replace("](img/", "](")
                                   .replace("](benchmarks/pptmon/", "]("))
    if docs:
        IMG.mkdir(parents=True, exist_ok=True)
        RAW.mkdir(parents=True, exist_ok=True)
        for key in done:
            for f in out.glob(f"{key}*.json"):
                (RAW / f.name).write_bytes(f.read_bytes())
            for f in out.glob(f"{key}*.csv"):
                (RAW / f.name).write_bytes(f.read_bytes())
        # the section shows every figure whose raw data is in docs/, each with its own run;
        # the plots are drawn from that data too
        figs_in_docs = {k: json.loads((RAW / f"{k}.json").read_text())
                        for k in ("fig6", "fig7", "fig8") if (RAW / f"{k}.json").exists()}
        _plots(IMG, *(figs_in_docs.get(k, {}).get("rows", []) for k in ("fig6", "fig7", "fig8")))
        md = _markdown(figs_in_docs, "img")
        text = DOC.read_text() if DOC.exists() else ""
        if BEGIN in text and END in text:
            text = text[:text.index(BEGIN)] + md + text[text.index(END) + len(END):]
        else:
            text += "\n" + md + "\n"
        DOC.write_text(text)
    click.echo(str(out))


# for a `bench` click group elsewhere: bench.add_command(fathom.bench.pptmon.bench_pptmon)
command = bench_pptmon

if __name__ == "__main__":
    bench_pptmon()
