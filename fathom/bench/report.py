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


def foreign_vswitchd(own: tuple[str, ...] = ("/run/fathom-bench/",)) -> int:
    """ovs-vswitchd processes not started by this benchmark (other labs sharing the CPUs): those whose
    command line names none of the run directories in `own`."""
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "ovs-vswitchd" and \
                        not any(o in (d / "cmdline").read_text() for o in own):
                    n += 1
            except OSError:
                pass
    return n


def _cpu_ticks() -> dict[int, tuple[str, int]]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                out[int(d.name)] = (comm, int(fields[11]) + int(fields[12]))
            except (OSError, ValueError, IndexError):
                pass
    return out


def machine_activity(own: tuple[str, ...] = ("/run/fathom-bench/",), sample_s: float = 1.0) -> dict:
    """What else the shared machine was doing: load average, network namespaces and other ovs-vswitchd
    processes (other engineers' labs), and the processes that used the most CPU over `sample_s`."""
    a = _cpu_ticks()
    time.sleep(sample_s)
    b = _cpu_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    busy = sorted(((b[p][1] - a[p][1], b[p][0]) for p in b if p in a and p != os.getpid()), reverse=True)
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "netns_total": len(ns),
            "foreign_ovs_vswitchd": foreign_vswitchd(own),
            "busiest_processes_cpu_pct": [[comm, round(100 * t / hz / sample_s)] for t, comm in busy[:8] if t > 0]}


def busy(activity: list[dict]) -> bool:
    """A run counts as from a busy machine when other labs ran or the load average passed 1."""
    return any(a.get("foreign_ovs_vswitchd") or a["loadavg"][0] > 1.0 for a in activity)


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


def _activity_line(a: dict | None) -> str:
    if not a:
        return "not recorded"
    top = ", ".join(f"{c} {p} %" for c, p in a.get("busiest_processes_cpu_pct", [])[:5])
    return (f"loadavg {', '.join(f'{x:.2f}' for x in a['loadavg'])}; {a['netns_total']} network namespaces and "
            f"{a['foreign_ovs_vswitchd']} other ovs-vswitchd on the machine; busiest processes: {top or 'none'}")


def tput_cell(r: dict, mbps: bool = False) -> str:
    """An RFC 2544 result for a table: the confirmed rate, or 'not confirmed' with the search's rate."""
    if r.get("confirmed") is False:
        lowest = min(t["offered_pps"] for t in r["search"] if t["final"])
        return (f"not confirmed (search {r['search_pps'] / 1000:.1f} kpps; longer trials lost frames down to "
                f"{lowest / 1000:.1f} kpps)")
    return f"{r['throughput_mbps']:.1f}" if mbps else f"{r['throughput_pps'] / 1000:.1f} kpps"


def markdown(doc: dict) -> str:
    env, res, extra = doc["environment"], doc["results"], doc["extra"]
    plan = doc["plan"]
    L = [f"# Switch benchmark ({'QUICK' if plan['quick'] else 'full'})", "",
         f"- command: `{doc['command']}`", f"- date: {env['date_utc']}, took {doc['elapsed_s']:.0f} s",
         f"- kernel {env['kernel']}, {env['cpus']} CPUs ({env['cpu_model']}), clocksource {env['clocksource']}",
         f"- {env['ovs_version']}, os-ken {env['os_ken_version']}; timestamps: {env['timestamping']}",
         f"- machine at start: {_activity_line(env.get('machine_at_start'))}",
         f"- machine at end: {_activity_line(env.get('machine_at_end'))}"
         + (" — **a busy machine (shared with other engineers' labs and tests): expect noisier figures**"
            if env.get("contended") else ""),
         f"- RFC 2544: {plan['search'].get('describe', '')}",
         "- latency = kernel TX stamp -> kernel RX stamp of the same frame; frame sizes include the FCS", ""]

    def lat_table(rows, keycols, socket=False):
        head = keycols + ["offered Mb/s", "achieved Mb/s", "n", "loss %", "min µs", "mean µs", "std µs",
                          "p50 µs", "p90 µs", "p99 µs", "p99.9 µs", "max µs"]
        head += ["to socket p50 µs", "to socket p99 µs"] if socket else []
        head += ["gen-limited"]
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            loss = r.get("loss_ratio")
            cells = [str(r.get(k, "")) for k in keycols] + [
                f"{r['offered_mbps']:.1f}", f"{r['achieved_mbps']:.1f}", str(r.get("latency_n")),
                "" if loss is None else f"{100 * loss:.3f}", us(r.get("latency_min_ns")), us(r.get("latency_mean_ns")),
                us(r.get("latency_std_ns")), us(r.get("latency_p50_ns")), us(r.get("latency_p90_ns")),
                us(r.get("latency_p99_ns")), us(r.get("latency_p999_ns")), us(r.get("latency_max_ns"))]
            if socket:
                cells += [us(r.get("latency_socket_p50_ns")), us(r.get("latency_socket_p99_ns"))]
            cells.append("**yes**" if r.get("generator_limited") else "no")
            out.append("| " + " | ".join(cells) + " |")
        return out

    if res.get("calibration"):
        L += ["## Calibration: the measuring system's floor", "",
              "- `veth`: direct veth pair. Both stamps come from one call chain on one CPU: the TX stamp in g0's "
              "`veth_xmit`, the RX stamp when r0's backlog queue accepts the frame (`netif_rx`). This floor is the "
              "cost of handing a frame across a veth; it contains no receive path.",
              "- *to socket*: the same frames, TX stamp -> the receiving thread's clock when `recvmmsg` returned "
              "them (r0's backlog, softirq, AF_PACKET delivery, the thread's wake-up; a user-space clock read).",
              "- `redirect`: g0 -> dg0 [tc mirred redirect] dr0 -> r0. dg0's whole receive path (backlog, "
              "softirq, up to tc ingress) and a second veth lie between the stamps: the floor for a device "
              "that receives frames.", ""]
        L += lat_table(res["calibration"], ["device", "frame_size_bytes"], socket=True) + [""]
    for r in res.get("tx-stamp-check", []):
        L += ["## TX stamps against an independent clock read", "",
              f"{r['what']}: {r['matched']} of {r['frames_sent']} frames matched ({r['captured']} captured), "
              f"{r['negative']} negative, {r.get('past_next_capture', 0)} past the next frame's capture; "
              f"difference min {us(r['min_ns'])} µs, p50 {us(r['p50_ns'])} µs, "
              f"p99 {us(r['p99_ns'])} µs, max {us(r['max_ns'])} µs.", ""]
    if res.get("generator-ratio"):
        L += ["## Generator: fathom-traffic against trafgen (same veth, same frames, one core)", "",
              "Rates from the sending veth's kernel counters (tx_packets + tx_dropped) over the same window for "
              "both tools, turn about; ratios are per repeat (the two runs of a repeat are back to back). "
              "Frames per CPU-second divide by the CPU time (schedstat) the tool's processes got in the window, "
              "which other work on the shared core does not take.", "",
              "| frame B | ours kpps (median) | trafgen kpps (median) | ours/trafgen, rate: median [min–max] | "
              "per repeat | ours/trafgen, frames per CPU-second: median [min–max] |",
              "|---|---|---|---|---|---|"]

        def rng(r, name):
            if f"{name}_median" not in r:
                return ""
            return f"{r[f'{name}_median']:.3f} [{r[f'{name}_min']:.3f}–{r[f'{name}_max']:.3f}]"
        for r in res["generator-ratio"]:
            L.append(f"| {r['frame_size_bytes']} | {r['ours_pps_median'] / 1000:.1f} | "
                     f"{r['trafgen_pps_median'] / 1000:.1f} | {rng(r, 'ours_over_trafgen')} | "
                     f"{', '.join(f'{x:.3f}' for x in r['ours_over_trafgen_per_repeat'])} | "
                     f"{rng(r, 'per_cpu_ours_over_trafgen')} |")
        L.append("")
    sections = [("action-delay", "Action delay (>= 30,000 frames each, 128 B)", ["device", "action"]),
                ("frame-size", "Latency and loss against frame size at a fixed load", ["device", "frame_size_bytes"]),
                ("load", "Latency and loss against offered load (150-byte frames; veth = calibration)", ["device"])]
    for key, title, cols in sections:
        if res.get(key):
            L += [f"## {title}", ""] + lat_table(res[key], cols) + [""]
    for key, title in (("calibration-throughput", "Tool ceiling (RFC 2544 search over the direct veth, not confirmed)"),
                       ("throughput", "RFC 2544 throughput (highest rate with loss <= tolerance)")):
        if res.get(key):
            L += [f"## {title}", "", "| device | frame B | repeat | short-trial search kpps | throughput (confirmed) | "
                  "Mb/s | trials | 10 GbE line rate kpps | generator-limited |", "|---|---|---|---|---|---|---|---|---|"]
            for r in res[key]:
                L.append(f"| {r['device']} | {r['frame_size_bytes']} | {r.get('repeat', 0)} | "
                         f"{r['search_pps'] / 1000:.1f} | {tput_cell(r)} | "
                         f"{r['throughput_mbps']:.1f} | {r['trials']} | "
                         f"{r['line_rate_10g_pps'] / 1000:.1f} | {'**yes**' if r['generator_limited'] else 'no'} |")
            L.append("")
    if any(r["repeats"] > 1 for r in res.get("throughput-repeats", [])):
        L += ["Over the repeats:", "", "| device | frame B | repeats | median kpps | min kpps | max kpps |",
              "|---|---|---|---|---|---|"]
        for r in res["throughput-repeats"]:
            L.append(f"| {r['device']} | {r['frame_size_bytes']} | {r['repeats']} | {r['median_pps'] / 1000:.1f} | "
                     f"{r['min_pps'] / 1000:.1f} | {r['max_pps'] / 1000:.1f} |")
        L.append("")
    if res.get("flow-install"):
        fi = extra.get("flow_install", {})
        from .switch import summarize
        rows = res["flow-install"]
        s = summarize([r["install_delay_ns"] for r in rows if r["install_delay_ns"] is not None])
        lb = summarize([r["active_after_ns"] for r in rows if r["active_after_ns"] is not None])
        before = sum(1 for r in rows if r["active_before_barrier"])
        bd = fi.get("barrier_delay_ns")
        L += ["## Flow-install delay (flow_mod on the switch's loopback -> first frame forwarded by the new rule)", "",
              f"Clock: {fi.get('clock')}. Zero-loss rate of the device with all {fi.get('flows')} flows installed: "
              f"{(fi.get('zero_loss_pps') or 0) / 1000:.1f} kpps ({fi.get('zero_loss_method')}"
              f"{'' if fi.get('zero_loss_confirmed') is not False else '; the longer trial did not confirm it: the short trials rate is used'}"
              f"); probes at "
              f"{100 * (fi.get('probe_share_of_zero_loss') or 0):.0f} % of it, {(fi.get('probe_pps') or 0) / 1000:.1f} kpps "
              f"round-robin: one probe per flow every {(fi.get('probe_interval_per_flow_ns') or 0) / 1e6:.2f} ms (the "
              f"resolution). {fi.get('flow_mods_captured')} of {fi.get('flows')} flow_mods captured; flow_mods "
              f"spread over {(fi.get('send_span_ns') or 0) / 1e6:.2f} ms; barrier reply "
              f"{'?' if bd is None else f'{bd / 1e6:.2f}'} ms after the first flow_mod; {before} of {len(rows)} "
              f"flows forwarded before the barrier reply; {fi.get('flows_never_forwarded')} never forwarded; for "
              f"{fi.get('first_forwarded_left_before_flow_mod')} flows the first probe forwarded had left before the "
              f"flow_mod reached the switch (it waited at the switch's input). "
              f"Probes lost after their flow was active: **{fi.get('probes_lost_after_active')}** of "
              f"{fi.get('probes')} (dropped before activation, by design: {fi.get('probes_dropped_before_active')}).", "",
              "| delay from the flow_mod | n | min ms | p50 ms | p90 ms | p99 ms | max ms | mean ms |",
              "|---|---|---|---|---|---|---|---|"]
        for label, d in (("to the first probe forwarded (upper bound)", s),
                         ("to the last probe not forwarded (lower bound)", lb)):
            L.append(f"| {label} | {d['n']} | " + " | ".join("" if d[k] is None else f"{d[k] / 1e6:.3f}" for k in
                                                          ("min_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns", "mean_ns")) + " |")
        L.append("")
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
        L += ["## Overlay: VXLAN tunnel vs the same path on a VLAN (the VXLAN paper, Fig. 8)", "",
              f"RFC 2544 throughput ({ov.get('method', '')}) and, beside it, the maximum received rate when offered "
              "the generator's top rate (MRR). Frame sizes are the VM's frames; VXLAN adds 50 bytes on the underlay.", "",
              "| frame B | VLAN Mb/s | VXLAN Mb/s | VXLAN / VLAN | VLAN MRR Mb/s | VXLAN MRR Mb/s | MRR ratio | gen-limited |",
              "|---|---|---|---|---|---|---|---|"]
        by = {(r["path"], r["frame_size_bytes"]): r for r in res["overlay"]}
        for size in sorted({r["frame_size_bytes"] for r in res["overlay"]}):
            a, b = by.get(("vlan", size)), by.get(("vxlan", size))
            if not (a and b):
                continue
            both = a["confirmed"] is not False and b["confirmed"] is not False and a["throughput_pps"]
            ratio = f"{b['throughput_pps'] / a['throughput_pps']:.2f}" if both else "—"
            mrr = f"{b['max_received_pps'] / a['max_received_pps']:.2f}" if a["max_received_pps"] else "—"
            L.append(f"| {size} | {tput_cell(a, mbps=True)} | {tput_cell(b, mbps=True)} | {ratio} | "
                     f"{a['max_received_mbps']:.1f} | {b['max_received_mbps']:.1f} | {mrr} | "
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


def plots(out: Path, results: dict, extra: dict | None = None) -> list[str]:
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
        def medians(rows, key, confirmed_only=False):
            per_size: dict = {}
            for r in rows:  # the median of the repeats at each size
                if not confirmed_only or r.get("confirmed") is not False:
                    per_size.setdefault(r["frame_size_bytes"], []).append(r[key])
            return sorted(per_size), per_size

        for i, (dev, rows) in enumerate(by_device(tp).items()):
            name = "tool ceiling (veth)" if dev == "veth" else dev
            xs_d, per = medians(rows, "throughput_pps", confirmed_only=True)
            ax.plot(xs_d, [statistics.median(per[s]) * s * 8 / 1e6 for s in xs_d], marker="o", color=f"C{i}",
                    label=f"{name}" + ("" if dev == "veth" else " (confirmed)"))
            if dev != "veth":
                xs_s, per_s = medians(rows, "search_pps")
                ax.plot(xs_s, [statistics.median(per_s[s]) * s * 8 / 1e6 for s in xs_s], marker="x", ls=":",
                        color=f"C{i}", label=f"{name} (short-trial search)")
        for j, (path, rows) in enumerate(by_device(ov).items()):
            color = f"C{5 + j}"
            rows = sorted(rows, key=lambda r: r["frame_size_bytes"])
            ok = [r for r in rows if r.get("confirmed") is not False]
            ax.plot([r["frame_size_bytes"] for r in ok], [r["throughput_pps"] * r["frame_size_bytes"] * 8 / 1e6 for r in ok],
                    marker="s", ls="-.", color=color, label=f"lab {path} (zero loss, confirmed)")
            ax.plot([r["frame_size_bytes"] for r in rows], [r["max_received_pps"] * r["frame_size_bytes"] * 8 / 1e6 for r in rows],
                    marker="^", ls=":", color=color, label=f"lab {path} (max received)")
        ax.set_yscale("log"); ax.set_xlabel("frame size (bytes)"); ax.set_ylabel("zero-loss throughput (Mb/s of frames)")
        ax.set_title("RFC 2544 throughput vs frame size"); ax.grid(alpha=.3)
        ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
        save(fig, "throughput_vs_frame_size.png")
    if results.get("flow-install"):
        d = sorted(r["install_delay_ns"] / 1e6 for r in results["flow-install"] if r["install_delay_ns"] is not None)
        if d:
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.step(d, [(i + 1) / len(d) for i in range(len(d))], where="post",
                    label="to the first probe forwarded (upper bound)")
            lb = sorted(r["active_after_ns"] / 1e6 for r in results["flow-install"] if r.get("active_after_ns") is not None)
            if lb:
                ax.step(lb, [(i + 1) / len(lb) for i in range(len(lb))], where="post", ls=":",
                        label="to the last probe not forwarded (lower bound)")
            bd = (extra or {}).get("flow_install", {}).get("barrier_delay_ns")
            if bd:
                ax.axvline(bd / 1e6, color="red", ls="--", label=f"barrier reply ({bd / 1e6:.2f} ms after the first flow_mod)")
            ax.set_xlabel("delay after the flow_mod reached the switch (ms, kernel stamps)"); ax.set_ylabel("fraction of flows")
            ax.set_title("Flow-install delay CDF"); ax.legend(fontsize=8); ax.grid(alpha=.3)
            save(fig, "flow_install_cdf.png")
    return made


def dumps_compact_lists(doc: dict) -> str:
    """JSON with 2-space indentation, except that lists of numbers (histogram buckets, latencies) stay on
    one line each: the file stays readable and a tenth of the size."""
    def compact(v):
        if isinstance(v, dict):
            return {k: compact(x) for k, x in v.items()}
        if isinstance(v, list):
            if v and all(isinstance(x, (int, float)) or (isinstance(x, list) and all(isinstance(y, (int, float))
                                                                                   for y in x)) for x in v):
                return _Raw(json.dumps(v, separators=(",", ":")))
            return [compact(x) for x in v]
        return v
    marks: dict[str, str] = {}

    def default(o):
        if isinstance(o, _Raw):
            key = f"@@raw{len(marks)}@@"
            marks[key] = o.text
            return key
        return str(o)
    text = json.dumps(compact(doc), indent=2, default=default)
    for key, raw in marks.items():
        text = text.replace(f'"{key}"', raw, 1)
    return text


class _Raw:
    def __init__(self, text: str):
        self.text = text


def write(out: Path, doc: dict) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    doc["csv"] = write_csvs(out, doc["results"])
    try:
        doc["plots"] = plots(out, doc["results"], doc.get("extra"))
    except Exception as e:  # a plot failure must not lose the numbers
        doc["plots"], doc["plot_error"] = [], f"{type(e).__name__}: {e}"
    (out / "results.json").write_text(dumps_compact_lists(doc))
    (out / "summary.md").write_text(markdown(doc))
    return doc
