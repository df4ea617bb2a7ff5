"""`fathom bench pptmon`: the PPTMon paper's Figs 6-8 on the lab.

  fig6  processing time vs number of iptables rules, PPTMon against a capture reference
        (the same packets captured on the VNF's in0 and out0 with nanosecond timestamps)
  fig7  iperf3 TCP throughput with PPTMon off and at 0.5 / 1 / 10 / 20 samples/s and
        every packet
  fig8  throughput of firewall / NAT / forwarder VNFs with PPTMon off and at 1 sample/s

Results go to results/pptmon/<stamp>/ (JSON, CSV, Markdown, PNG); with --docs the
Markdown and PNGs also replace the benchmark section of docs/pptmon.md.
Run: sudo .venv/bin/python -m fathom.bench.pptmon [--quick] [--docs]
"""
from __future__ import annotations

import csv
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import click

from fathom.host.iperf import iperf3
from fathom.pptmon import chain as chainmod
from fathom.pptmon import control, measure

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "pptmon.md"
IMG = ROOT / "docs" / "img"
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


def fig6(out: Path, rules_list: list[int], packets: int) -> list[dict]:
    name = "ppbf6"
    c = chainmod.Chain(name=name, vnfs=[chainmod.Vnf("firewall", 0)], base=60, offloads=False)
    control.down(name)
    chainmod.up(c)
    rows = []
    try:
        control.enable(name, period_ns=0)
        ns = c.vnf_ns(1)
        for proto in ("udp", "tcp"):
            for rules in rules_list:
                _set_rules(c, 1, rules)
                n0 = len(control.records(name))
                p_in, p_out = out / f"f6_{proto}_{rules}_in.pcap", out / f"f6_{proto}_{rules}_out.pcap"
                with measure.Capture(ns, "in0", p_in, proto), measure.Capture(ns, "out0", p_out, proto):
                    if proto == "udp":
                        measure.transfer(c, "udp", count=packets, rate=500, size=[200])
                    else:
                        measure.transfer(c, "tcp", bytes=packets * 150)
                time.sleep(0.3)
                recs = [r for r in control.records(name)[n0:] if r["flow"]["proto"] == proto]
                acc = measure.accuracy(recs, measure.timestamps(p_in, proto),
                                       measure.timestamps(p_out, proto))
                row = {"proto": proto, "rules": rules, "matched": acc["matched"]}
                for key, tag in (("pptmon", "pptmon"), ("reference", "ref"),
                                 ("ref_minus_pptmon", "diff")):
                    for st in ("mean_us", "stddev_us", "p50_us", "p99_us", "min_us"):
                        row[f"{tag}_{st}"] = acc[key].get(st)
                rows.append(row)
                p_in.unlink(missing_ok=True)
                p_out.unlink(missing_ok=True)
                click.echo(f"fig6 {proto} rules={rules}: pptmon {row['pptmon_mean_us']:.1f} µs, "
                           f"capture {row['ref_mean_us']:.1f} µs, diff {row['diff_mean_us']:.1f} µs",
                           err=True)
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


def _markdown(env: dict, cmd: str, f6, f7, f8, img: str) -> str:
    L = [BEGIN, "", f"Command: `{cmd}`  ", f"Run: {env['time']} — kernel {env['kernel']}, "
         f"{env['cpus']} CPUs, {env['ovs']} (not used by the chain: Linux bridges).", ""]
    if f6:
        L += ["### Fig. 6 — processing time vs iptables rules (PPTMon vs capture)", "",
              "Every packet marked (`--period 0`), 500 packets/s of 200-byte UDP datagrams or a "
              "paced TCP stream; one firewall VNF, offloads off; PPTMon and the reference are "
              "compared **per packet** (same IP ID / TCP sequence number on in0 and out0).", "",
              f"![fig6]({img}/pptmon_fig6.png)", "",
              "| proto | rules | packets | PPTMon mean ± sd (µs) | capture mean ± sd (µs) | "
              "capture − PPTMon mean / p50 / min (µs) |", "|---|---|---|---|---|---|"]
        for r in f6:
            if not r["matched"]:
                continue
            L.append(f"| {r['proto']} | {r['rules']} | {r['matched']} | {r['pptmon_mean_us']:.1f} ± "
                     f"{r['pptmon_stddev_us']:.1f} | {r['ref_mean_us']:.1f} ± {r['ref_stddev_us']:.1f} | "
                     f"{r['diff_mean_us']:.1f} / {r['diff_p50_us']:.1f} / {r['diff_min_us']:.1f} |")
        diffs = {p: [r["diff_mean_us"] for r in f6 if r["proto"] == p and r["matched"]]
                 for p in ("tcp", "udp")}
        L += ["", "Mean difference over all rule counts: " + ", ".join(
            f"{p.upper()} {statistics.mean(v):.1f} µs (sd {statistics.pstdev(v):.1f})"
            for p, v in diffs.items() if v) + " (paper: TCP 6.5 µs, UDP 3.8 µs).", ""]
    if f7:
        L += ["### Fig. 7 — throughput vs sampling rate", "",
              "One VNF (firewall, no rules), iperf3 TCP; settings interleaved, mean ± sd over "
              "the runs.", "", f"![fig7]({img}/pptmon_fig7.png)", "",
              "Peak throughput of one run varies by 10-30 % on this 2-CPU VM (client, server "
              "and all packet work share two CPUs), far more than the effect at low sampling "
              "rates, so two steadier measures follow: CPU time (all CPUs, /proc/stat) per GB "
              "transferred at a fixed 1 Gb/s, and the mean run time of our two programs per "
              "packet from the kernel's BPF run statistics (separate runs; the statistics "
              "themselves add a few tens of ns per run, so these are upper bounds) with the "
              "share of one CPU they used.", "",
              "| offloads | PPTMon | peak Gb/s (mean ± sd) | peak ratio to off | CPU-s per GB at 1 Gb/s "
              "(mean ± sd) | CPU ratio to off | ns/packet in + out | CPU share of programs |",
              "|---|---|---|---|---|---|---|---|"]
        for r in f7:
            cost = share = ""
            if r.get("ppt_in_ns_per_pkt") is not None:
                cost = f"{r['ppt_in_ns_per_pkt']:.0f} + {r['ppt_out_ns_per_pkt'] or 0:.0f}"
                share = f"{100 * (r['ppt_in_cpu_share'] + r['ppt_out_cpu_share']):.2f} %"
            L.append(f"| {'on' if r['offloads'] else 'off'} | {r['setting']} | {r['gbps_mean']:.2f} ± "
                     f"{r['gbps_std']:.2f} | {r['ratio_vs_off']:.3f} | {r['cpu_s_per_gb']:.3f} ± "
                     f"{r['cpu_s_per_gb_std']:.3f} | {r['cpu_ratio_vs_off']:.3f} | {cost} | {share} |")
        L.append("")
    if f8:
        L += ["### Fig. 8 — throughput per VNF kind, PPTMon off vs 1 sample/s", "",
              f"![fig8]({img}/pptmon_fig8.png)", "", "| VNF | off (Gb/s) | 1/s (Gb/s) | ratio |",
              "|---|---|---|---|"]
        for r in f8:
            L.append(f"| {r['vnf']} | {r['off_gbps']:.2f} | {r['on_gbps']:.2f} | {r['ratio']:.3f} |")
        L.append("")
    L.append(END)
    return "\n".join(L)


@click.command("pptmon")
@click.option("--figs", default="6,7,8", show_default=True, help="which figures to run")
@click.option("--quick", is_flag=True, help="fewer points, shorter runs (a smoke run)")
@click.option("--seconds", default=4.0, show_default=True, help="iperf3 run length")
@click.option("--reps", default=3, show_default=True, help="repetitions per throughput point")
@click.option("--docs", is_flag=True, help="also rewrite the benchmark section of docs/pptmon.md")
@click.option("--out", "out_dir", default=None, help="results directory")
def bench_pptmon(figs, quick, seconds, reps, docs, out_dir):
    """Reproduce the PPTMon paper's Figs 6-8 (PPTMon accuracy and overhead) on the lab."""
    want = {int(x) for x in figs.split(",") if x.strip()}
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(out_dir) if out_dir else ROOT / "results" / "pptmon" / stamp
    out.mkdir(parents=True, exist_ok=True)
    if quick:
        seconds, reps = 2.0, 1
    rules = [0, 100, 500] if quick else [0, 100, 500, 1000, 2000]
    env = {**measure.env(), "time": stamp}
    f6 = fig6(out, rules, 300 if quick else 1000) if 6 in want else []
    f7 = []
    if 7 in want:
        f7 = fig7(seconds, reps, offloads=False) + fig7(seconds, reps, offloads=True)
    f8 = fig8(seconds, reps) if 8 in want else []
    data = {"env": env, "fig6": f6, "fig7": f7, "fig8": f8}
    (out / "pptmon.json").write_text(json.dumps(data, indent=2))
    for key, rows in (("fig6", f6), ("fig7", f7), ("fig8", f8)):
        if rows:
            with open(out / f"pptmon_{key}.csv", "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=[k for k in rows[0] if not k.endswith("runs")],
                                   extrasaction="ignore")
                w.writeheader()
                w.writerows(rows)
    names = _plots(out, f6, f7, f8)
    if Path(sys.argv[0]).name == "fathom":
        cmd = "sudo .venv/bin/fathom " + " ".join(sys.argv[1:])
    else:
        cmd = "sudo .venv/bin/python -m fathom.bench.pptmon" + "".join(" " + a for a in sys.argv[1:])
    md = _markdown(env, cmd, f6, f7, f8, "img")
    (out / "pptmon.md").write_text(md.replace("](img/", "]("))
    if docs:
        IMG.mkdir(parents=True, exist_ok=True)
        for n in names:
            (IMG / n).write_bytes((out / n).read_bytes())
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
