"""`fathom bench vtap`: the setting of the vTAP paper's Fig. 8 on the lab, in one run.

One node's br-int (userspace datapath) holds sender vm1, receiver vm2 and monitor mon1. For each
offered load, frame size and mode — no tap, the fathom tap (group ALL + recovery rule), OVS port
mirroring (a Mirror row: select_src_port=vm1, output_port=mon1, i.e. SPAN on the same bridge) — the
traffic engine sends UDP frames of exactly that size at exactly that rate from vm1 to vm2 (paced, the
same offered load in every mode, checked against what the sender achieved) and counts, by sequence
number, the frames the receiver got and the copies the monitor got. The switch's cost is the CPU time
of the node's ovs-vswitchd over the run (schedstat, ns), per frame delivered, reported only where
nothing was lost (at saturation it would be one over the throughput, not a cost).

Modes are interleaved per size, and their order rotates per repeat, so that drift of a shared machine
hits all of them. Ratios between modes are taken per repeat (runs of one repeat are back to back),
then summarised by their median and range.

A TCP sweep (iperf3, one stream, unpaced: the most the path carries) is labelled by the MSS it asked
for and the mean frame size the receiver got; sizes whose MSS would be below Linux's floor of 88 bytes
are not run (they would repeat the 88-byte run). A run that fails stops the benchmark with its error.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fathom.bench import procs
from fathom.client import Client

from fathom.lab.lab import Lab
from fathom.lab.topology import parse

from .engine import BenchError, Port, engine_args, run_engine

LAB = "tvb"
TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1001, cidr: 198.19.1.0/24}
nodes:
  - name: compute1
    role: compute
    vms:
      - {name: vm1, mac: "02:fa:00:00:01:01", ip: 198.19.1.11/24, network: blue}
      - {name: vm2, mac: "02:fa:00:00:01:02", ip: 198.19.1.12/24, network: blue}
      - {name: mon1, mac: "02:fa:00:00:01:a1", ip: 198.19.1.101/24, network: blue}
underlay:
  cidr: 198.18.0.0/24
  mtu: 1600
"""
SENDER_IP, RECEIVER_IP = "198.19.1.11", "198.19.1.12"
RECEIVER_MAC = "02:fa:00:00:01:02"
MODES = ("none", "fathom", "mirror")
SIZES = (64, 128, 256, 512, 1024, 1518)   # Ethernet frames including the FCS, as RFC 2544 counts them
LOADS_PPS = (10000, 40000)
TCP_OVERHEAD = 14 + 20 + 32 + 4  # Ethernet + IPv4 + TCP with timestamps + FCS: frame size - MSS
TCP_MIN_MSS = 88                 # Linux's floor for TCP_MAXSEG
SENDER_LIMIT = 0.97              # achieved/offered below this: the sender did not offer the load


def tcp_sizes(sizes) -> list[int]:
    """The frame sizes a TCP run can honour (MSS at or above Linux's floor)."""
    return [s for s in sizes if s - TCP_OVERHEAD >= TCP_MIN_MSS]


@dataclass
class Params:
    seconds: float = 2.0
    sizes: tuple = SIZES
    loads_pps: tuple = LOADS_PPS
    repeats: int = 3
    protos: tuple = ("udp", "tcp")


class VtapBench:
    def __init__(self, params: Params, lab: str = LAB, progress=print):
        self.p = params
        self.progress = progress
        self.lab = Lab(lab)
        self.tap_id = None

    # ----------------------------------------------------------------- lab and modes
    def up(self) -> None:
        self.lab.down()
        self.lab.up(parse(TOPOLOGY, "<bench vtap>"), "<bench vtap>")
        self.api = Client.for_lab(self.lab.state())

    def down(self) -> None:
        self.lab.down()

    def ns(self, target: str, *cmd: str, check=True, timeout=60) -> subprocess.CompletedProcess:
        return self.lab.run(target, *cmd, check=check, timeout=timeout)

    def set_mode(self, mode: str) -> None:
        if self.tap_id is not None:
            self.api.delete(f"/taps/{self.tap_id}")
            self.tap_id = None
        self.ns("compute1", "ovs-vsctl", "clear", "Bridge", "br-int", "mirrors")
        if mode == "fathom":
            self.tap_id = self.api.post("/taps", json={"name": "bench", "sender": "vm1", "receiver": "vm2",
                                                       "monitor": "mon1"})["id"]
            deadline = time.monotonic() + 20
            while not self.api.tap_stats(self.tap_id).get("realised"):
                if time.monotonic() > deadline:
                    raise BenchError("the tap was not realised within 20 s")
                self.api.sync()
                time.sleep(0.3)
        elif mode == "mirror":
            self.ns("compute1", "ovs-vsctl", "--", "--id=@src", "get", "Port", "vm1", "--", "--id=@out", "get", "Port",
                    "mon1", "--", "--id=@m", "create", "Mirror", "name=span", "select_src_port=@src",
                    "output_port=@out", "--", "set", "Bridge", "br-int", "mirrors=@m")
        else:
            self.api.sync()
        # A Mirror change does not revalidate cached datapath flows at once (kube-ovn#2801): flush them
        # after every mode change, for every mode alike.
        self.ns("compute1", "ovs-appctl", "revalidator/purge")
        time.sleep(0.5)

    # ----------------------------------------------------------------- measurements
    def switch_cpu_ns(self) -> int:
        """CPU time (ns) of every thread of the node's ovs-vswitchd, from schedstat."""
        return procs.schedstat_ns(self.lab.ovs("compute1").pid("ovs-vswitchd"))

    def counters(self, vm: str) -> tuple[int, int]:
        out = self.ns(vm, "cat", "/sys/class/net/eth0/statistics/rx_packets",
                      "/sys/class/net/eth0/statistics/rx_bytes").stdout.split()
        return int(out[0]), int(out[1])

    def run_udp(self, size: int, pps: float, mode: str) -> dict:
        tx = Port(self.lab.ns("vm1"), "eth0")
        rx = Port(self.lab.ns("vm2"), "eth0", RECEIVER_MAC)
        args = engine_args(tx, rx, size=size, rate_pps=pps, count=max(100, pps * self.p.seconds), dst_mac=rx.mac,
                           linger_s=0.5, extra=["--src-ip", SENDER_IP, "--dst-ip", RECEIVER_IP,
                                                "--mon-ns", self.lab.ns("mon1"), "--mon-if", "eth0",
                                                "--spin-us", "20", "--fifo"])
        idle = self.idle_cpu_share()
        c0, t0 = self.switch_cpu_ns(), time.monotonic()
        r = run_engine(args)  # a failed run raises BenchError: no zero points
        cpu_ns, wall = self.switch_cpu_ns() - c0, time.monotonic() - t0
        return udp_row(r, size, pps, mode, cpu_ns, idle * wall * 1e9)

    def idle_cpu_share(self, seconds: float = 1.0) -> float:
        """The share of a CPU ovs-vswitchd uses with no traffic (its main loop, revalidators, OpenFlow):
        subtracted from a run's CPU time so that the cost per frame is the traffic's."""
        c0, t0 = self.switch_cpu_ns(), time.monotonic()
        time.sleep(seconds)
        return (self.switch_cpu_ns() - c0) / 1e9 / (time.monotonic() - t0)

    def run_tcp(self, size: int, mode: str) -> dict:
        mss = size - TCP_OVERHEAD
        server = subprocess.Popen([*self.lab.exec_args("vm2", [])[0], "iperf3", "-s", "-1", "-B", RECEIVER_IP],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(0.3)
            r0, m0 = self.counters("vm2"), self.counters("mon1")
            c0 = self.switch_cpu_ns()
            out = self.ns("vm1", "iperf3", "-c", RECEIVER_IP, "-t", str(self.p.seconds), "-M", str(mss), "-J",
                          check=False, timeout=self.p.seconds + 30)
            time.sleep(0.2)
            r1, m1 = self.counters("vm2"), self.counters("mon1")
            cpu_ns = self.switch_cpu_ns() - c0
        finally:
            try:
                server.wait(5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        try:
            doc = json.loads(out.stdout)
        except ValueError:
            doc = {}
        if out.returncode != 0 or "error" in doc or "sum_received" not in doc.get("end", {}):
            raise BenchError(f"iperf3 TCP run ({size} B, {mode}) failed: "
                             f"{doc.get('error') or out.stderr.strip() or out.returncode}")
        s = doc["end"]["sum_received"]
        rx_pk, rx_b = r1[0] - r0[0], r1[1] - r0[1]
        mon_pk = m1[0] - m0[0]
        return {"proto": "tcp", "size_bytes": size, "mss": mss, "mode": mode, "seconds": s["seconds"],
                "receiver_mbps": round(s["bits_per_second"] / 1e6, 2), "receiver_frames": rx_pk,
                "mean_frame_bytes": round(rx_b / rx_pk + 4, 1) if rx_pk else None,  # + FCS, as sizes count it
                "monitor_frames": mon_pk, "monitor_over_receiver": round(mon_pk / rx_pk, 4) if rx_pk else None,
                "switch_cpu_ms": round(cpu_ns / 1e6, 2), "saturated": True, "switch_us_per_frame": None,
                "retransmits": doc["end"].get("sum_sent", {}).get("retransmits")}

    # ----------------------------------------------------------------- the sweep
    def sweep(self) -> dict:
        raw: list[dict] = []
        for rep in range(self.p.repeats):
            order = MODES[rep % len(MODES):] + MODES[:rep % len(MODES)]
            if "udp" in self.p.protos:
                for pps in self.p.loads_pps:
                    for size in self.p.sizes:
                        for mode in order:
                            self.set_mode(mode)
                            row = {**self.run_udp(size, pps, mode), "repeat": rep}
                            raw.append(row)
                            self.progress(f"[{rep + 1}/{self.p.repeats}] udp {size:>5} B {pps / 1000:>5.0f} kpps "
                                          f"{mode:<7} receiver {row['receiver_frames']}/{row['sent']} monitor "
                                          f"{row['monitor_frames']}")
            if "tcp" in self.p.protos:
                for size in tcp_sizes(self.p.sizes):
                    for mode in order:
                        self.set_mode(mode)
                        row = {**self.run_tcp(size, mode), "repeat": rep}
                        raw.append(row)
                        self.progress(f"[{rep + 1}/{self.p.repeats}] tcp MSS {row['mss']:>5} {mode:<7} receiver "
                                      f"{row['receiver_mbps']:8.1f} Mb/s")
        self.set_mode("none")
        return {"raw": raw, "points": aggregate(raw), "ratios": ratios(raw)}


def udp_row(r: dict, size: int, pps: float, mode: str, cpu_ns: int, idle_ns: float = 0.0) -> dict:
    """One UDP run: what was offered and achieved, what the receiver and the monitor got (by sequence
    number), the switch's CPU time and, where nothing was lost, its CPU time per frame delivered over
    what it spends idle in the same time (idle_ns)."""
    tx, rx, mon = r["tx"], r["rx"], r["monitor"]
    sent, dur = tx["offered"], tx["duration_s"] or 1e-9
    achieved = tx["achieved_pps"]
    sender_limited = achieved < SENDER_LIMIT * pps
    lossless = rx["lost"] == 0 and not sender_limited
    return {"proto": "udp", "size_bytes": size, "mode": mode, "offered_pps": round(pps, 1),
            "offered_mbps": round(pps * size * 8 / 1e6, 2), "achieved_pps": round(achieved, 1),
            "sender_limited": sender_limited, "seconds": round(dur, 3), "sent": sent,
            "device_drops_at_sender": tx["device_drops"],
            "receiver_frames": rx["unique"], "receiver_lost": rx["lost"], "receiver_loss_ratio": rx["loss_ratio"],
            "receiver_mbps": round(rx["unique"] * size * 8 / dur / 1e6, 2),
            "monitor_frames": mon["unique"], "monitor_duplicates": mon["duplicates"],
            "monitor_mbps": round(mon["unique"] * size * 8 / dur / 1e6, 2),
            "monitor_over_receiver": round(mon["unique"] / rx["unique"], 4) if rx["unique"] else None,
            "latency_p50_us": _us(r["latency"].get("p50_ns")), "latency_p99_us": _us(r["latency"].get("p99_ns")),
            "copy_latency_p50_us": _us(mon.get("latency", {}).get("p50_ns")),
            "copy_latency_p99_us": _us(mon.get("latency", {}).get("p99_ns")),
            "switch_cpu_ms": round(cpu_ns / 1e6, 2), "switch_idle_cpu_ms": round(idle_ns / 1e6, 2),
            "saturated": not lossless,
            "switch_us_per_frame": round((cpu_ns - idle_ns) / 1e3 / rx["unique"], 3) if lossless and rx["unique"]
            else None}


def _us(ns):
    return None if ns is None else round(ns / 1000, 2)


def _key(r: dict) -> tuple:
    return (r["proto"], r["size_bytes"], r.get("offered_pps"))


def _median_range(values: list) -> dict:
    v = [x for x in values if x is not None]
    if not v:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(v), 4), "min": min(v), "max": max(v)}


def aggregate(raw: list[dict]) -> list[dict]:
    """Per (proto, size, load, mode): the median over repeats of the receiver's throughput with its range,
    the per-run monitor/receiver frame ratios (median and range, never a ratio of medians), the CPU per
    frame where defined, and how many runs were saturated or sender-limited."""
    groups: dict = {}
    for r in raw:
        groups.setdefault(_key(r) + (r["mode"],), []).append(r)
    out = []
    for (proto, size, pps, mode), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0,
                                                                               MODES.index(kv[0][3]))):
        rx = _median_range([x["receiver_mbps"] for x in rows])
        ratio = _median_range([x["monitor_over_receiver"] for x in rows])
        cpu = _median_range([x["switch_us_per_frame"] for x in rows])
        out.append({"proto": proto, "size_bytes": size, "offered_pps": pps, "mode": mode, "n": len(rows),
                    "receiver_mbps": rx["median"], "receiver_mbps_min": rx["min"], "receiver_mbps_max": rx["max"],
                    "receiver_frames_median": statistics.median(x["receiver_frames"] for x in rows),
                    "monitor_over_receiver_median": ratio["median"], "monitor_over_receiver_min": ratio["min"],
                    "monitor_over_receiver_max": ratio["max"],
                    "monitor_over_receiver_per_run": [x["monitor_over_receiver"] for x in rows],
                    "switch_us_per_frame": cpu["median"],
                    "saturated_runs": sum(1 for x in rows if x.get("saturated")),
                    "sender_limited_runs": sum(1 for x in rows if x.get("sender_limited")),
                    "mss": rows[0].get("mss"), "mean_frame_bytes": _median_range(
                        [x.get("mean_frame_bytes") for x in rows])["median"]})
    return out


def ratios(raw: list[dict]) -> list[dict]:
    """Per (proto, size, load): what the receiver got with the fathom tap and with mirroring over no tap,
    and fathom over mirror (UDP: frames of the same offered stream; TCP: Mb/s), each taken within one
    repeat and then summarised (median, min, max)."""
    by: dict = {}
    for r in raw:
        by.setdefault(_key(r), {}).setdefault(r["repeat"], {})[r["mode"]] = r
    out = []
    for key, reps in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        metric = "receiver_frames" if key[0] == "udp" else "receiver_mbps"  # same offered frames / unpaced TCP

        def per_repeat(a: str, b: str) -> list[float]:
            vals = []
            for modes in reps.values():
                if a in modes and b in modes and modes[b][metric]:
                    vals.append(modes[a][metric] / modes[b][metric])
            return vals
        row = {"proto": key[0], "size_bytes": key[1], "offered_pps": key[2], "repeats": len(reps), "metric": metric}
        for a, b in (("fathom", "none"), ("mirror", "none"), ("fathom", "mirror")):
            v = per_repeat(a, b)
            mr = _median_range(v)
            row[f"{a}_over_{b}"] = mr["median"]
            row[f"{a}_over_{b}_min"] = None if mr["min"] is None else round(mr["min"], 4)
            row[f"{a}_over_{b}_max"] = None if mr["max"] is None else round(mr["max"], 4)
        for a in ("fathom", "mirror"):  # the switch's extra CPU per frame for making the copy, same repeat
            v = [m[a]["switch_us_per_frame"] - m["none"]["switch_us_per_frame"] for m in reps.values()
                 if a in m and "none" in m and m[a].get("switch_us_per_frame") is not None
                 and m["none"].get("switch_us_per_frame") is not None]
            mr = _median_range(v)
            row[f"{a}_copy_us_per_frame"] = None if mr["median"] is None else round(mr["median"], 3)
            row[f"{a}_copy_us_per_frame_range"] = None if mr["min"] is None else [round(mr["min"], 3), round(mr["max"], 3)]
        out.append(row)
    return out


def markdown(doc: dict) -> str:
    from .report import _activity_line
    env = doc["environment"]
    L = [f"# fathom bench vtap — {doc['started']}{' (QUICK)' if doc.get('quick') else ''}", "",
         f"command: `{doc['command']}`", "",
         f"- kernel {env['kernel']}, {env['cpus']} CPUs ({env['cpu_model']}), {env['ovs_version']}",
         f"- machine at start: {_activity_line(env.get('machine_at_start'))}",
         f"- machine at end: {_activity_line(env.get('machine_at_end'))}"
         + (" — **a busy machine (shared with other engineers' labs and tests)**" if env.get("contended") else ""),
         f"- {doc['seconds']} s per run, {doc['repeats']} repeat(s), modes interleaved per size; medians with "
         "[min–max] over repeats; ratios taken per repeat", "",
         "## UDP: the traffic engine, fixed frame size and rate (the same offered load in every mode)", "",
         "Frame sizes include the FCS. Receiver and monitor counts are unique sequence numbers of the stream. "
         "vswitchd µs/frame = ovs-vswitchd CPU time (schedstat) during the run, less what it uses idle over the "
         "same time (measured for 1 s before each run), over the frames delivered; only for runs without loss "
         "('sat.' = saturated: CPU per frame would be one over the throughput). The copy's cost is that figure "
         "with the tap less without it, in the same repeat.", "",
         "| size B | offered kpps (Mb/s) | mode | receiver Mb/s [min–max] | monitor/receiver frames, per run | "
         "vswitchd µs/frame | runs saturated / sender-limited |", "|---|---|---|---|---|---|---|"]
    for r in doc["points"]:
        if r["proto"] != "udp":
            continue
        L.append(f"| {r['size_bytes']} | {r['offered_pps'] / 1000:g} ({r['offered_pps'] * r['size_bytes'] * 8 / 1e6:.0f}) "
                 f"| {r['mode']} | {r['receiver_mbps']:.2f} [{r['receiver_mbps_min']:.2f}–{r['receiver_mbps_max']:.2f}] | "
                 f"{'' if r['mode'] == 'none' else ', '.join(str(x) for x in r['monitor_over_receiver_per_run'])} | "
                 f"{'sat.' if r['switch_us_per_frame'] is None else round(r['switch_us_per_frame'], 1)} | "
                 f"{r['saturated_runs']} / {r['sender_limited_runs']} of {r['n']} |")
    L += ["", "| size B | offered kpps | receiver frames fathom/none [min–max] | mirror/none [min–max] | "
          "fathom/mirror [min–max] | copy µs/frame fathom [min–max] | copy µs/frame mirror [min–max] |",
          "|---|---|---|---|---|---|---|"]

    def copy(r, a):
        v, rg = r.get(f"{a}_copy_us_per_frame"), r.get(f"{a}_copy_us_per_frame_range")
        return "" if v is None else f"{v:+.2f} [{rg[0]:+.2f}–{rg[1]:+.2f}]"
    for r in doc["ratios"]:
        if r["proto"] != "udp":
            continue
        cell = lambda k: "" if r[k] is None else f"{r[k]:.3f} [{r[k + '_min']:.3f}–{r[k + '_max']:.3f}]"  # noqa: E731
        L.append(f"| {r['size_bytes']} | {r['offered_pps'] / 1000:g} | {cell('fathom_over_none')} | "
                 f"{cell('mirror_over_none')} | {cell('fathom_over_mirror')} | {copy(r, 'fathom')} | {copy(r, 'mirror')} |")
    tcp = [r for r in doc["points"] if r["proto"] == "tcp"]
    if tcp:
        L += ["", "## TCP: iperf3, one stream, unpaced (the most the path carried)", "",
              "Labelled by the MSS asked for; the mean frame is what the receiver got (incl. FCS). Saturating: "
              "no CPU-per-frame figure.", "",
              "| MSS | mean frame B | mode | receiver Mb/s [min–max] | monitor/receiver frames, per run |",
              "|---|---|---|---|---|"]
        for r in tcp:
            L.append(f"| {r['mss']} | {r['mean_frame_bytes']} | {r['mode']} | {r['receiver_mbps']} "
                     f"[{r['receiver_mbps_min']}–{r['receiver_mbps_max']}] | "
                     f"{'' if r['mode'] == 'none' else ', '.join(str(x) for x in r['monitor_over_receiver_per_run'])} |")
        L += ["", "| MSS | fathom/none [min–max] | mirror/none [min–max] | fathom/mirror [min–max] |", "|---|---|---|---|"]
        mss = {r["size_bytes"]: r["mss"] for r in tcp}
        for r in doc["ratios"]:
            if r["proto"] == "tcp":
                cell = lambda k: "" if r[k] is None else f"{r[k]:.3f} [{r[k + '_min']:.3f}–{r[k + '_max']:.3f}]"  # noqa: E731
                L.append(f"| {mss.get(r['size_bytes'])} | {cell('fathom_over_none')} | {cell('mirror_over_none')} | "
                         f"{cell('fathom_over_mirror')} |")
    return "\n".join(L) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    loads = sorted({r["offered_pps"] for r in doc["points"] if r["proto"] == "udp"})
    fig, axes = plt.subplots(1, len(loads) + 1, figsize=(5.5 * (len(loads) + 1), 4.2), squeeze=False)
    styles = {"none": ("k", "o"), "fathom": ("tab:blue", "s"), "mirror": ("tab:orange", "^")}
    sizes = sorted({r["size_bytes"] for r in doc["points"]})
    for ax, pps in zip(axes[0], loads):
        for mode in MODES:
            rows = sorted((r for r in doc["points"] if r["proto"] == "udp" and r["mode"] == mode
                           and r["offered_pps"] == pps), key=lambda r: r["size_bytes"])
            if not rows:
                continue
            color, marker = styles[mode]
            xs = [r["size_bytes"] for r in rows]
            ax.errorbar(xs, [r["receiver_mbps"] for r in rows],
                        yerr=[[r["receiver_mbps"] - r["receiver_mbps_min"] for r in rows],
                              [r["receiver_mbps_max"] - r["receiver_mbps"] for r in rows]],
                        color=color, marker=marker, capsize=3, label=f"receiver, {mode}")
        ax.plot(sizes, [pps * s * 8 / 1e6 for s in sizes], color="grey", ls=":", label="offered")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(s) for s in sizes])
        ax.set_xlabel("frame size (bytes, incl. FCS)")
        ax.set_ylabel("receiver throughput (Mb/s)")
        ax.set_title(f"UDP at {pps / 1000:g} kpps offered")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[0][len(loads)]
    for pps, ls in zip(loads, ("-", "--", ":")):
        for mode in MODES:
            rows = sorted((r for r in doc["points"] if r["proto"] == "udp" and r["mode"] == mode
                           and r["offered_pps"] == pps and r["switch_us_per_frame"] is not None),
                          key=lambda r: r["size_bytes"])
            if rows:
                color, marker = styles[mode]
                ax.plot([r["size_bytes"] for r in rows], [r["switch_us_per_frame"] for r in rows], color=color,
                        marker=marker, linestyle=ls, label=f"{pps / 1000:g} kpps, {mode}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(s) for s in sizes])
    ax.set_xlabel("frame size (bytes, incl. FCS)")
    ax.set_ylabel("ovs-vswitchd CPU µs per frame delivered")
    ax.set_title("switch cost per frame (runs without loss)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("vTAP: receiver throughput with no tap, the fathom tap and OVS mirroring (lab br-int, netdev)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(doc: dict, out: Path) -> list[str]:
    import csv
    out.mkdir(parents=True, exist_ok=True)
    (out / "vtap.json").write_text(json.dumps(doc, indent=2))
    with open(out / "vtap.csv", "w", newline="") as f:
        cols: list[str] = []
        for r in doc["raw"]:
            cols += [k for k in r if k not in cols]
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(doc["raw"])
    (out / "vtap.md").write_text(markdown(doc))
    plot(doc, out / "vtap.png")
    return [str(out / n) for n in ("vtap.json", "vtap.csv", "vtap.md", "vtap.png")]
