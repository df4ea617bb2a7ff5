"""Writing a benchmark run: results.json, one CSV per module, summary.md and PNG plots (Agg)."""
from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

from fathom.stats import percentile

LINE_RATES_GBPS = (1, 10)


def dist(values: list[float]) -> dict:
    """The distribution the measurement conventions ask for: min, p50, p90, p99, p99.9, max, mean, std-dev."""
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": min(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "p99.9": percentile(values, 99.9), "max": max(values),
            "mean": statistics.fmean(values), "stdev": statistics.pstdev(values)}


def environment() -> dict:
    def sh(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return None
    cpu_model = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        clocksource = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
    except OSError:
        clocksource = None
    import importlib.metadata as md
    return {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kernel": platform.release(),
            "cpus": os.cpu_count(), "cpu_model": cpu_model, "clocksource": clocksource,
            "ovs_version": (sh("ovs-vswitchd", "--version") or "").split("\n")[0],
            "os_ken_version": md.version("os-ken"), "python": platform.python_version(),
            "loadavg_at_start": os.getloadavg(), "foreign_ovs_vswitchd_at_start": foreign_vswitchd(),
            "timestamping": "kernel software SO_TIMESTAMPING on veth (no hardware clock offered)"}


def foreign_vswitchd() -> int:
    """ovs-vswitchd processes not started by this benchmark (other labs sharing the CPUs)."""
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "ovs-vswitchd" and \
                        "fathom-bench" not in (d / "cmdline").read_text() and "/sbov/" not in (d / "cmdline").read_text():
                    n += 1
            except OSError:
                pass
    return n


def _flat(v):
    return json.dumps(v) if isinstance(v, (list, dict)) else v


def write_csvs(out: Path, results: dict) -> list[str]:
    files = []
    for module, rows in results.items():
        if not rows:
            continue
        cols: list[str] = []
        for r in rows:
            cols += [k for k in r if k not in cols]
        name = f"{module}.csv"
        with open(out / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            for r in rows:
                w.writerow({k: _flat(r.get(k)) for k in cols})
        files.append(name)
    return files


def us(ns):
    return "" if ns is None else f"{ns / 1000:.2f}"


def markdown(doc: dict) -> str:
    env, res, extra = doc["environment"], doc["results"], doc["extra"]
    L = [f"# Switch benchmark ({'quick' if doc['plan']['quick'] else 'full'})", "",
         f"- command: `{doc['command']}`", f"- date: {env['date_utc']}, took {doc['elapsed_s']:.0f} s",
         f"- kernel {env['kernel']}, {env['cpus']} CPUs ({env['cpu_model']}), clocksource {env['clocksource']}",
         f"- {env['ovs_version']}, os-ken {env['os_ken_version']}; timestamps: {env['timestamping']}",
         f"- machine load: loadavg {', '.join(f'{x:.2f}' for x in env['loadavg_at_start'])} at start, "
         f"{', '.join(f'{x:.2f}' for x in env.get('loadavg_at_end', []))} at end; "
         f"{env.get('foreign_ovs_vswitchd_at_start')} other ovs-vswitchd processes were running"
         + (" (**the CPUs were shared: expect noisier figures**)" if env.get("contended") else ""),
         "- latency = kernel TX stamp -> kernel RX stamp of the same frame; frame sizes include the FCS", ""]

    def lat_table(rows, keycols):
        head = keycols + ["offered Mb/s", "achieved Mb/s", "n", "loss %", "min µs", "mean µs", "std µs",
                          "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "max µs", "gen-limited"]
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            loss = r.get("loss_ratio")
            out.append("| " + " | ".join([str(r.get(k, "")) for k in keycols] + [
                f"{r['offered_mbps']:.1f}", f"{r['achieved_mbps']:.1f}", str(r.get("latency_n")),
                "" if loss is None else f"{100 * loss:.3f}", us(r.get("latency_min_ns")), us(r.get("latency_mean_ns")),
                us(r.get("latency_std_ns")), us(r.get("latency_p50_ns")), us(r.get("latency_p90_ns")),
                us(r.get("latency_p99_ns")), us(r.get("latency_p999_ns")), us(r.get("latency_max_ns")),
                "**yes**" if r.get("generator_limited") else "no"]) + " |")
        return out

    sections = [("calibration", "Calibration: direct veth pair (the measuring system's floor)", ["frame_size_bytes"]),
                ("action-delay", "Action delay (>= 30,000 frames each, 128 B)", ["device", "action"]),
                ("frame-size", "Latency and loss against frame size at a fixed load", ["device", "frame_size_bytes"]),
                ("load", "Latency and loss against offered load (150-byte frames; veth = calibration)", ["device"])]
    for key, title, cols in sections:
        if res.get(key):
            L += [f"## {title}", ""] + lat_table(res[key], cols) + [""]
    for key, title in (("calibration-throughput", "Tool ceiling (RFC 2544 throughput over the direct veth)"),
                       ("throughput", "RFC 2544 throughput (highest rate with loss <= tolerance)")):
        if res.get(key):
            L += [f"## {title}", "", "| device | frame B | throughput kpps | Mb/s | 10 GbE line rate kpps | trials | generator-limited |",
                  "|---|---|---|---|---|---|---|"]
            for r in res[key]:
                L.append(f"| {r['device']} | {r['frame_size_bytes']} | {r['throughput_pps'] / 1000:.1f} | "
                         f"{r['throughput_mbps']:.1f} | {r['line_rate_10g_pps'] / 1000:.1f} | {r['trials']} | "
                         f"{'**yes**' if r['generator_limited'] else 'no'} |")
            L.append("")
    if res.get("flow-install"):
        fi = extra.get("flow_install", {})
        d = [r["install_delay_ns"] for r in res["flow-install"] if r["install_delay_ns"] is not None]
        from .switch import summarize
        s = summarize(d)
        missing = sum(1 for r in res["flow-install"] if r["install_delay_ns"] is None)
        before = sum(1 for r in res["flow-install"] if r["active_before_barrier"])
        L += ["## Flow-install delay (flow_mod sent -> first frame forwarded by the new rule)", "",
              f"{fi.get('flows')} flows, probes at {fi.get('probe_pps', 0) / 1000:.0f} kpps round-robin "
              f"(one probe per flow every {fi.get('probe_interval_per_flow_ns', 0) / 1e6:.2f} ms: the resolution).",
              f"flow_mods sent over {fi.get('send_span_ns', 0) / 1e6:.2f} ms; barrier reply "
              f"{fi.get('barrier_delay_ns', 0) / 1e6:.2f} ms after the first flow_mod; "
              f"{before} of {len(res['flow-install'])} flows forwarded before the barrier reply; {missing} never seen.", "",
              "| n | min ms | p50 ms | p90 ms | p99 ms | max ms | mean ms |", "|---|---|---|---|---|---|---|",
              f"| {s['n']} | " + " | ".join("" if s[k] is None else f"{s[k] / 1e6:.3f}" for k in
                                           ("min_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns", "mean_ns")) + " |", ""]
    for key, title in (("packet-in", "packet_in latency (data-plane TX stamp -> controller handler)"),
                       ("echo", "OpenFlow echo round trip")):
        if res.get(key):
            r = res[key][0]
            L += [f"## {title}", "", "| n | loss % | min µs | p50 µs | p90 µs | p99 µs | max µs | mean µs | std µs |",
                  "|---|---|---|---|---|---|---|---|---|",
                  f"| {r['n']} | {100 * r.get('loss_ratio', 0):.2f} | " + " | ".join(
                      us(r[k]) for k in ("min_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns", "mean_ns", "std_ns")) + " |",
                  "", f"clock: {r['clock']}", ""]
    if res.get("overlay"):
        ov = extra.get("overlay", {})
        L += ["## Overlay: VXLAN tunnel vs the same path on a VLAN (paper 004 Fig. 8)", "",
              "Zero-loss throughput (RFC 2544 binary search) and, beside it, the maximum received rate when offered the generator's "
              "top rate (MRR). Frame sizes are the VM's frames; VXLAN adds 50 bytes on the underlay.", "",
              "| frame B | VLAN Mb/s | VXLAN Mb/s | VXLAN / VLAN | VLAN MRR Mb/s | VXLAN MRR Mb/s | MRR ratio | gen-limited |",
              "|---|---|---|---|---|---|---|---|"]
        by = {(r["path"], r["frame_size_bytes"]): r for r in res["overlay"]}
        for size in sorted({r["frame_size_bytes"] for r in res["overlay"]}):
            a, b = by.get(("vlan", size)), by.get(("vxlan", size))
            if not (a and b):
                continue
            ratio = b["throughput_pps"] / a["throughput_pps"] if a["throughput_pps"] else float("nan")
            mrr = b["max_received_pps"] / a["max_received_pps"] if a["max_received_pps"] else float("nan")
            L.append(f"| {size} | {a['throughput_mbps']:.1f} | {b['throughput_mbps']:.1f} | {ratio:.2f} | "
                     f"{a['max_received_mbps']:.1f} | {b['max_received_mbps']:.1f} | {mrr:.2f} | "
                     f"{'**yes**' if a['generator_limited'] or b['generator_limited'] else 'no'} |")
        L += ["", f"TCP reference (iperf3, 2 s): VLAN {ov.get('iperf3_vlan_gbps')} Gb/s, VXLAN {ov.get('iperf3_vxlan_gbps')} Gb/s", "",
              "ARP-learned tunnel neighbour table (`ovs-appctl tnl/neigh/show`, node1):", "", "```",
              (ov.get("tnl_neigh_show_after") or {}).get("node1", "").rstrip(), "```", ""]
    if doc.get("plots"):
        L += ["## Plots", ""] + [f"![{p}]({p})" for p in doc["plots"]] + [""]
    return "\n".join(L)


def _lat_lines(ax, x, rows, dev, color):
    """mean (solid), p50 (dotted) and p99 (dashed) of one device in one colour; std-dev is in the tables."""
    def col(k):
        return [None if r.get(k) is None else r[k] / 1000 for r in rows]
    ax.plot(x, col("latency_mean_ns"), marker="o", color=color, label=f"{dev} mean")
    ax.plot(x, col("latency_p50_ns"), marker=".", ls=":", color=color, label=f"{dev} p50")
    ax.plot(x, col("latency_p99_ns"), marker="x", ls="--", color=color, label=f"{dev} p99")


def plots(out: Path, results: dict) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)

    def by_device(rows):
        d = {}
        for r in rows:
            d.setdefault(r.get("device", r.get("path")), []).append(r)
        return d

    fs = list(results.get("calibration", [])) + list(results.get("frame-size", []))
    if fs:  # paper Figs. 2 and 4 (latency) and 5 (loss) against frame size
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        for i, (dev, rows) in enumerate(by_device([{**r, "device": r.get("device", "veth")} for r in fs]).items()):
            rows = sorted(rows, key=lambda r: r["frame_size_bytes"])
            x = [r["frame_size_bytes"] for r in rows]
            _lat_lines(a1, x, rows, dev, f"C{i}")
            a2.plot(x, [100 * (r["loss_ratio"] or 0) for r in rows], marker="o", color=f"C{i}", label=dev)
        a1.set_yscale("log"); a1.set_xlabel("frame size (bytes)"); a1.set_ylabel("latency (µs)")
        a1.set_title("Latency vs frame size (fixed load)"); a1.legend(fontsize=6, ncol=2); a1.grid(alpha=.3)
        a2.set_xlabel("frame size (bytes)"); a2.set_ylabel("frame loss (%)"); a2.set_title("Loss vs frame size")
        a2.legend(fontsize=7); a2.grid(alpha=.3)
        save(fig, "latency_vs_frame_size.png")
    if results.get("load"):  # paper Figs. 3, 6 and 7
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        for i, (dev, rows) in enumerate(by_device(results["load"]).items()):
            rows = sorted(rows, key=lambda r: r["offered_mbps"])
            x = [r["offered_mbps"] for r in rows]
            _lat_lines(a1, x, rows, dev, f"C{i}")
            a2.plot(x, [100 * (r["loss_ratio"] or 0) for r in rows], marker="o", color=f"C{i}", label=dev)
            for r in rows:
                if r["generator_limited"]:
                    a2.annotate("gen-limited", (r["offered_mbps"], 100 * (r["loss_ratio"] or 0)), fontsize=6)
        a1.set_yscale("log"); a1.set_xlabel("offered load (Mb/s, 150-byte frames)"); a1.set_ylabel("latency (µs)")
        a1.set_title("Latency vs load"); a1.legend(fontsize=6, ncol=2); a1.grid(alpha=.3)
        a2.set_xlabel("offered load (Mb/s)"); a2.set_ylabel("frame loss (%)"); a2.set_title("Loss vs load")
        a2.legend(fontsize=7); a2.grid(alpha=.3)
        save(fig, "latency_loss_vs_load.png")
    tp = list(results.get("calibration-throughput", [])) + list(results.get("throughput", []))
    ov = results.get("overlay", [])
    if tp or ov:
        fig, ax = plt.subplots(figsize=(9.5, 4.5))
        sizes = sorted({r["frame_size_bytes"] for r in tp + ov})
        xs = list(range(64, max(sizes) + 1, 8))
        for g in LINE_RATES_GBPS:
            ax.plot(xs, [g * 1000 * s / (s + 20) for s in xs], color="grey", lw=1, ls=":" if g == 1 else "--",
                    label=f"{g} GbE line rate (frame bits)")
        for dev, rows in by_device(tp).items():
            rows = sorted(rows, key=lambda r: r["frame_size_bytes"])
            name = "tool ceiling (veth)" if dev == "veth" else dev
            ax.plot([r["frame_size_bytes"] for r in rows], [r["throughput_pps"] * r["frame_size_bytes"] * 8 / 1e6 for r in rows],
                    marker="o", label=name)
        for path, rows in by_device(ov).items():
            rows = sorted(rows, key=lambda r: r["frame_size_bytes"])
            ax.plot([r["frame_size_bytes"] for r in rows], [r["throughput_pps"] * r["frame_size_bytes"] * 8 / 1e6 for r in rows],
                    marker="s", ls="-.", label=f"lab {path} (zero loss)")
            ax.plot([r["frame_size_bytes"] for r in rows], [r["max_received_pps"] * r["frame_size_bytes"] * 8 / 1e6 for r in rows],
                    marker="^", ls=":", label=f"lab {path} (max received)")
        ax.set_yscale("log"); ax.set_xlabel("frame size (bytes)"); ax.set_ylabel("zero-loss throughput (Mb/s of frames)")
        ax.set_title("RFC 2544 throughput vs frame size"); ax.grid(alpha=.3)
        ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
        save(fig, "throughput_vs_frame_size.png")
    if results.get("flow-install"):
        d = sorted(r["install_delay_ns"] / 1e6 for r in results["flow-install"] if r["install_delay_ns"] is not None)
        if d:
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.step(d, [(i + 1) / len(d) for i in range(len(d))], where="post", label="flow_mod -> first frame forwarded")
            b = results["flow-install"][0]["barrier_delay_ns"] / 1e6
            ax.axvline(b, color="red", ls="--", label=f"barrier reply ({b:.2f} ms)")
            ax.set_xlabel("delay after the flow_mod was sent (ms)"); ax.set_ylabel("fraction of flows")
            ax.set_title("Flow-install delay CDF"); ax.legend(fontsize=8); ax.grid(alpha=.3)
            save(fig, "flow_install_cdf.png")
    return made


def write(out: Path, doc: dict) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    doc["csv"] = write_csvs(out, doc["results"])
    try:
        doc["plots"] = plots(out, doc["results"])
    except Exception as e:  # a plot failure must not lose the numbers
        doc["plots"], doc["plot_error"] = [], f"{type(e).__name__}: {e}"
    (out / "results.json").write_text(json.dumps(doc, indent=2, default=str))
    (out / "summary.md").write_text(markdown(doc))
    return doc
