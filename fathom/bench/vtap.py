"""`fathom bench vtap`: the setting of the vTAP paper's Fig. 8 on the lab, in one run.

One node's br-int (userspace datapath) holds sender vm1, receiver vm2 and monitor mon1. For each
frame size and each mode — no tap, the fathom tap (group ALL + recovery rule), OVS port mirroring
(a Mirror row: select_src_port=vm1, output_port=mon1, i.e. SPAN on the same bridge) — vm1 sends
to vm2 with iperf3 (UDP at a fixed offered load, then TCP), and the receive counters of vm2's and
mon1's eth0 (the kernel's, read in their namespaces) give the RX throughput of the originals and of
the copies. Modes are interleaved per size so that drift of a shared machine hits all of them.
A last UDP run below saturation gives the share of copies delivered: frames the monitor received
over frames the receiver received (both count the iperf3 control connection, which is tapped too).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from fathom.client import Client

from fathom.lab.lab import Lab
from fathom.lab.topology import parse

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
RECEIVER_IP = "198.19.1.12"
MODES = ("none", "fathom", "mirror")
SIZES = (64, 128, 256, 512, 1024, 1500)
UDP_OVERHEAD = 14 + 20 + 8      # Ethernet + IPv4 + UDP headers: frame size (no FCS) - payload
TCP_OVERHEAD = 14 + 20 + 32     # Ethernet + IPv4 + TCP with timestamps


@dataclass
class Point:
    proto: str
    size: int
    mode: str
    seconds: float
    sent_packets: int = 0
    rx_packets: int = 0
    rx_bytes: int = 0
    mon_packets: int = 0
    mon_bytes: int = 0
    iperf_mbps: float = 0.0
    switch_cpu_s: float = 0.0       # CPU time ovs-vswitchd of the node spent during the run
    extra: dict = field(default_factory=dict)

    @property
    def rx_mbps(self) -> float:
        return self.rx_bytes * 8 / self.seconds / 1e6

    @property
    def mon_mbps(self) -> float:
        return self.mon_bytes * 8 / self.seconds / 1e6

    def row(self) -> dict:
        return {"proto": self.proto, "size_bytes": self.size, "mode": self.mode, "seconds": round(self.seconds, 3),
                "sent_packets": self.sent_packets, "receiver_packets": self.rx_packets,
                "receiver_mbps": round(self.rx_mbps, 2), "monitor_packets": self.mon_packets,
                "monitor_mbps": round(self.mon_mbps, 2), "iperf_mbps": round(self.iperf_mbps, 2),
                "switch_cpu_s": round(self.switch_cpu_s, 3),
                "switch_us_per_packet": round(self.switch_cpu_s * 1e6 / self.rx_packets, 3) if self.rx_packets else None,
                "copies_share": round(self.mon_packets / self.rx_packets, 4) if self.rx_packets else None}


class VtapBench:
    def __init__(self, seconds: float = 2.0, udp_mbps: float = 200.0, below_mbps: float = 20.0,
                 sizes=SIZES, progress=print):
        self.seconds, self.udp_mbps, self.below_mbps, self.sizes = seconds, udp_mbps, below_mbps, tuple(sizes)
        self.progress = progress
        self.lab = Lab(LAB)
        self.tap_id = None

    # ----------------------------------------------------------------- lab and modes
    def up(self) -> None:
        self.lab.down()
        self.lab.up(parse(TOPOLOGY, "<bench vtap>"), "<bench vtap>")
        self.api = Client(self.lab.state()["controller"]["url"])

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
                    raise RuntimeError("the tap was not realised within 20 s")
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

    # ----------------------------------------------------------------- one measurement
    def switch_cpu(self) -> float:
        """utime + stime (all threads) of the node's ovs-vswitchd, in seconds."""
        pid = self.lab.ovs("compute1").pid("ovs-vswitchd")
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def counters(self, vm: str) -> tuple[int, int]:
        out = self.ns(vm, "cat", "/sys/class/net/eth0/statistics/rx_packets", "/sys/class/net/eth0/statistics/rx_bytes").stdout.split()
        return int(out[0]), int(out[1])

    def run(self, proto: str, size: int, mode: str, mbps: float | None = None) -> Point:
        server = subprocess.Popen([*self.lab.exec_args("vm2", [])[0], "iperf3", "-s", "-1", "-B", RECEIVER_IP],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        args = ["iperf3", "-c", RECEIVER_IP, "-t", str(self.seconds), "-J"]
        if proto == "udp":
            args += ["-u", "-b", f"{mbps or self.udp_mbps}M", "-l", str(max(16, size - UDP_OVERHEAD))]
        else:
            args += ["-M", str(max(88, size - TCP_OVERHEAD))]
        r0, m0 = self.counters("vm2"), self.counters("mon1")
        c0 = self.switch_cpu()
        t0 = time.monotonic()
        out = self.ns("vm1", *args, check=False, timeout=self.seconds + 30)
        elapsed = time.monotonic() - t0
        time.sleep(0.2)
        r1, m1 = self.counters("vm2"), self.counters("mon1")
        cpu = self.switch_cpu() - c0
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
        p = Point(proto, size, mode, min(elapsed, self.seconds + 0.5))
        try:
            end = json.loads(out.stdout)["end"]
        except (ValueError, KeyError):
            end = {}
        if proto == "udp":
            s = end.get("sum", {})
            p.sent_packets = s.get("packets", 0)
            p.iperf_mbps = s.get("bits_per_second", 0) / 1e6 * (1 - (s.get("lost_percent", 0) or 0) / 100)
            p.extra["lost_packets"] = s.get("lost_packets")
            p.seconds = s.get("seconds", self.seconds) or self.seconds
        else:
            s = end.get("sum_received", {})
            p.iperf_mbps = s.get("bits_per_second", 0) / 1e6
            p.seconds = s.get("seconds", self.seconds) or self.seconds
            p.sent_packets = 0
        p.switch_cpu_s = cpu
        p.rx_packets, p.rx_bytes = r1[0] - r0[0], r1[1] - r0[1]
        p.mon_packets, p.mon_bytes = m1[0] - m0[0], m1[1] - m0[1]
        return p

    # ----------------------------------------------------------------- the sweep
    def sweep(self, protos=("udp", "tcp"), repeats: int = 1) -> dict:
        points: list[Point] = []
        for r in range(repeats):
            for proto in protos:
                for size in self.sizes:
                    for mode in MODES:
                        self.set_mode(mode)
                        p = self.run(proto, size, mode)
                        p.extra["repeat"] = r
                        points.append(p)
                        self.progress(f"[{r + 1}/{repeats}] {proto} {size:>5} B {mode:<7} receiver "
                                      f"{p.rx_mbps:8.1f} Mb/s  monitor {p.mon_mbps:8.1f} Mb/s")
        below = []
        for mode in ("fathom", "mirror"):
            self.set_mode(mode)
            p = self.run("udp", 1024, mode, mbps=self.below_mbps)
            below.append(p)
            self.progress(f"below saturation ({self.below_mbps} Mb/s, 1024 B) {mode}: "
                          f"{p.mon_packets}/{p.rx_packets} copies delivered")
        self.set_mode("none")
        raw = [{**p.row(), "repeat": p.extra["repeat"]} for p in points]
        return {"repeats": repeats, "raw": raw, "points": aggregate(raw),
                "below_saturation": [p.row() for p in below]}


def aggregate(raw: list[dict]) -> list[dict]:
    """Median over repeats per (proto, size, mode), with the receiver's min and max."""
    import statistics
    groups: dict = {}
    for r in raw:
        groups.setdefault((r["proto"], r["size_bytes"], r["mode"]), []).append(r)
    out = []
    for (proto, size, mode), rows in groups.items():
        med = lambda k: round(statistics.median(x[k] for x in rows), 2)  # noqa: E731
        out.append({"proto": proto, "size_bytes": size, "mode": mode, "n": len(rows),
                    "receiver_mbps": med("receiver_mbps"), "monitor_mbps": med("monitor_mbps"),
                    "receiver_mbps_min": min(x["receiver_mbps"] for x in rows),
                    "receiver_mbps_max": max(x["receiver_mbps"] for x in rows),
                    "receiver_packets": int(med("receiver_packets")), "monitor_packets": int(med("monitor_packets")),
                    "sent_packets": int(med("sent_packets")),
                    "switch_us_per_packet": round(statistics.median(x["switch_us_per_packet"] or 0 for x in rows), 3),
                    "copies_share": round(sum(x["monitor_packets"] for x in rows)
                                          / max(1, sum(x["receiver_packets"] for x in rows)), 4)})
    return out


def ratios(rows: list[dict]) -> list[dict]:
    """Per (proto, size): receiver throughput with the fathom tap and with mirroring over no tap."""
    by = {(r["proto"], r["size_bytes"], r["mode"]): r for r in rows}
    out = []
    for (proto, size, mode), r in sorted(by.items()):
        if mode != "none":
            continue
        base = r["receiver_mbps"] or float("nan")
        f, m = by.get((proto, size, "fathom")), by.get((proto, size, "mirror"))
        out.append({"proto": proto, "size_bytes": size,
                    "fathom_over_none": round(f["receiver_mbps"] / base, 3) if f else None,
                    "mirror_over_none": round(m["receiver_mbps"] / base, 3) if m else None,
                    "fathom_over_mirror": round(f["receiver_mbps"] / m["receiver_mbps"], 3)
                    if f and m and m["receiver_mbps"] else None,
                    "fathom_monitor_over_receiver": round(f["monitor_mbps"] / f["receiver_mbps"], 3)
                    if f and f["receiver_mbps"] else None,
                    "mirror_monitor_over_receiver": round(m["monitor_mbps"] / m["receiver_mbps"], 3)
                    if m and m["receiver_mbps"] else None,
                    "switch_us_per_packet": {k: x.get("switch_us_per_packet") for k, x in
                                             (("none", r), ("fathom", f), ("mirror", m)) if x}})
    return out


def markdown(doc: dict) -> str:
    lines = [f"# fathom bench vtap — {doc['started']}", "", f"command: `{doc['command']}`", "",
             "environment: " + ", ".join(f"{k}={v}" for k, v in doc["environment"].items() if v is not None), "",
             f"UDP offered load {doc['udp_mbps']} Mb/s, {doc['seconds']} s per point; TCP: one iperf3 stream; "
             f"medians of {doc.get('repeats', 1)} interleaved repeats (receiver min–max in brackets).", "",
             "| proto | size (B) | mode | receiver Mb/s | monitor Mb/s | monitor/receiver frames | sent pkts | vswitchd µs/packet |",
             "|---|---|---|---|---|---|---|---|"]
    for r in doc["points"]:
        lines.append(f"| {r['proto']} | {r['size_bytes']} | {r['mode']} | {r['receiver_mbps']} "
                     f"[{r['receiver_mbps_min']}–{r['receiver_mbps_max']}] | {r['monitor_mbps']} | "
                     f"{r['copies_share'] if r['mode'] != 'none' else ''} | {r['sent_packets'] or ''} | "
                     f"{r['switch_us_per_packet']} |")
    lines += ["", "| proto | size (B) | fathom/none | mirror/none | fathom/mirror | fathom mon/rx | mirror mon/rx | "
              "vswitchd µs/pkt none / fathom / mirror |",
              "|---|---|---|---|---|---|---|---|"]
    for r in doc["ratios"]:
        cpu = r.get("switch_us_per_packet", {})
        lines.append(f"| {r['proto']} | {r['size_bytes']} | {r['fathom_over_none']} | {r['mirror_over_none']} | "
                     f"{r['fathom_over_mirror']} | {r['fathom_monitor_over_receiver']} | {r['mirror_monitor_over_receiver']} | "
                     f"{cpu.get('none')} / {cpu.get('fathom')} / {cpu.get('mirror')} |")
    lines += ["", "Below saturation:", ""]
    for r in doc["below_saturation"]:
        lines.append(f"- {r['mode']}: monitor received {r['monitor_packets']} frames for the receiver's "
                     f"{r['receiver_packets']} (share {r['copies_share']}; iperf3 sent {r['sent_packets']} datagrams)")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    protos = sorted({r["proto"] for r in doc["points"]}, reverse=True)
    fig, axes = plt.subplots(1, len(protos) + 1, figsize=(5.5 * (len(protos) + 1), 4.2), squeeze=False)
    styles = {"none": ("k", "o"), "fathom": ("tab:blue", "s"), "mirror": ("tab:orange", "^")}
    for ax, proto in zip(axes[0], protos):
        for mode in MODES:
            rows = sorted((r for r in doc["points"] if r["proto"] == proto and r["mode"] == mode),
                          key=lambda r: r["size_bytes"])
            if not rows:
                continue
            color, marker = styles[mode]
            xs = [r["size_bytes"] for r in rows]
            ax.errorbar(xs, [r["receiver_mbps"] for r in rows],
                        yerr=[[r["receiver_mbps"] - r["receiver_mbps_min"] for r in rows],
                              [r["receiver_mbps_max"] - r["receiver_mbps"] for r in rows]],
                        color=color, marker=marker, capsize=3, label=f"receiver, {mode}")
            if mode != "none":
                ax.plot(xs, [r["monitor_mbps"] for r in rows], color=color, marker=marker, linestyle="--",
                        markerfacecolor="none", markersize=10, label=f"monitor, {mode}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(doc["sizes"]))
        ax.set_xticklabels([str(s) for s in doc["sizes"]])
        ax.set_xlabel("frame size (bytes)")
        ax.set_ylabel("RX throughput (Mb/s)")
        ax.set_title(f"{proto.upper()}" + (f" at {doc['udp_mbps']} Mb/s offered" if proto == "udp" else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[0][len(protos)]
    for proto, ls in (("udp", "-"), ("tcp", ":")):
        for mode in MODES:
            rows = sorted((r for r in doc["points"] if r["proto"] == proto and r["mode"] == mode),
                          key=lambda r: r["size_bytes"])
            if rows:
                color, marker = styles[mode]
                ax.plot([r["size_bytes"] for r in rows], [r["switch_us_per_packet"] for r in rows], color=color,
                        marker=marker, linestyle=ls, label=f"{proto}, {mode}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(doc["sizes"]))
    ax.set_xticklabels([str(s) for s in doc["sizes"]])
    ax.set_xlabel("frame size (bytes)")
    ax.set_ylabel("ovs-vswitchd CPU µs per delivered packet")
    ax.set_title("switch cost per packet (median)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("vTAP: receiver and monitor RX throughput (paper 000 Fig. 8 setting), lab br-int netdev")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(doc: dict, out: Path) -> list[str]:
    import csv
    out.mkdir(parents=True, exist_ok=True)
    (out / "vtap.json").write_text(json.dumps(doc, indent=2))
    with open(out / "vtap.csv", "w", newline="") as f:
        rows = doc["raw"] + [{**r, "repeat": "below-saturation"} for r in doc["below_saturation"]]
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    (out / "vtap.md").write_text(markdown(doc))
    plot(doc, out / "vtap.png")
    return [str(out / n) for n in ("vtap.json", "vtap.csv", "vtap.md", "vtap.png")]
