"""The generator against a peer, in the same run: fathom-traffic and trafgen (netsniff-ng) each send
the same frames as fast as they can from one core into the same veth, turn about, several times.

Both are measured the same way, by the sending veth's own kernel counters (tx_packets + tx_dropped:
every frame the device was handed) over a window in the middle of the run, so neither tool's own
report is trusted; and by the CPU time the tool's processes got in that window (schedstat, ns), so
that frames per CPU-second compare the tools even when other work takes part of the core. fathom-traffic writes a sequence number and a send time into each frame and sends
with sendmmsg (32 a call, qdisc bypass); trafgen sends one fixed frame from an mmap TX ring (qdisc
bypass, its default). The frame bytes are otherwise identical (our template, built here).
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from fathom.bench import procs
from fathom.host.exec import argv
from fathom.lab.sh import run

from .engine import BenchError, engine_path

TOOLS = ("fathom-traffic", "trafgen")
TRAFGEN = "/usr/sbin/trafgen"


def frame_bytes(size: int, dst_mac: str, src_mac: str, src_ip: str = "198.18.0.1", dst_ip: str = "198.18.0.2",
                sport: int = 4242, dport: int = 9000) -> bytes:
    """The engine's frame of `size` bytes (FCS included, so size - 4 bytes): Ethernet/IPv4/UDP, the
    pktgen magic at the start of the payload, the engine's filler after its header."""
    n = size - 4
    mac = lambda m: bytes(int(x, 16) for x in m.split(":"))  # noqa: E731
    ip_len = n - 14
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, ip_len, 0, 0x4000, 64, 17, 0,
                               bytes(int(x) for x in src_ip.split(".")), bytes(int(x) for x in dst_ip.split("."))))
    s = sum(struct.unpack("!10H", bytes(ip)))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    ip[10:12] = struct.pack("!H", ~s & 0xFFFF)
    udp = struct.pack("!HHHH", sport, dport, ip_len - 20, 0)
    f = bytearray(mac(dst_mac) + mac(src_mac) + b"\x08\x00" + bytes(ip) + udp + struct.pack("!I", 0xBE9BE955))
    f += bytes(n - len(f))
    for i in range(14 + 28 + 24, n):
        f[i] = i & 0xFF
    return bytes(f)


def trafgen_config(frame: bytes) -> str:
    return "{ " + ", ".join(f"0x{b:02x}" for b in frame) + " }\n"


def _tx_counter(ns: str, ifname: str) -> int:
    st = json.loads(run(["ip", "-s", "-j", "link", "show", ifname], ns=ns).stdout)[0]["stats64"]["tx"]
    return int(st["packets"]) + int(st["dropped"])


def group_cpu_ns(pgid: int) -> int:
    """CPU time (ns, /proc/<pid>/task/<tid>/schedstat) of every thread of every process in a process group."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[2]) == pgid:
                total += procs.schedstat_ns(int(d.name))
        except (OSError, ValueError, IndexError):
            pass
    return total


def _window_rate(ns: str, ifname: str, pgid: int, warmup_s: float, window_s: float) -> dict:
    time.sleep(warmup_s)
    t1, c1, cpu1 = time.monotonic(), _tx_counter(ns, ifname), group_cpu_ns(pgid)
    time.sleep(window_s)
    t2, c2, cpu2 = time.monotonic(), _tx_counter(ns, ifname), group_cpu_ns(pgid)
    cpu_s = (cpu2 - cpu1) / 1e9
    return {"frames_in_window": c2 - c1, "window_s": round(t2 - t1, 4), "pps": round((c2 - c1) / (t2 - t1), 1),
            "cpu_s": round(cpu_s, 4), "cpu_share": round(cpu_s / (t2 - t1), 3),
            "frames_per_cpu_s": round((c2 - c1) / cpu_s, 1) if cpu_s > 0 else None}


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT to the generator's own process group (trafgen forks a worker that must get it too)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_once(tool: str, ns: str, ifname: str, size: int, dst_mac: str, src_mac: str, cpu: int,
             warmup_s: float, window_s: float) -> dict:
    """One tool, one frame size: its rate in frames/s over the window, from the veth's counters."""
    with tempfile.TemporaryDirectory(prefix="fathom-gen-") as tmp:
        if tool == "trafgen":
            cfg = Path(tmp) / "frame.cfg"
            cfg.write_text(trafgen_config(frame_bytes(size, dst_mac, src_mac)))
            # -P 1: one worker (pinned to the one CPU taskset leaves it); --no-sock-mem and -Q: leave the
            # machine's socket-memory sysctls and IRQ affinities alone (the machine is shared)
            args = argv(["taskset", "-c", str(cpu), TRAFGEN, "-o", ifname, "-i", str(cfg),
                         "-P", "1", "--no-sock-mem", "-Q", "-n", "0"], ns)
        else:
            args = argv([str(engine_path()), "gen", "--tx-if", ifname, "--size", str(size),
                         "--rate", "0", "--duration", str(warmup_s + window_s + 30), "--stamp-every", "0",
                         "--cpu-tx", str(cpu), "--dst-mac", dst_mac], ns)
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            res = _window_rate(ns, ifname, proc.pid, warmup_s, window_s)
            if proc.poll() is not None:
                raise BenchError(f"{tool} exited during the window: {proc.stderr.read().strip()[-300:]}")
        finally:
            _stop(proc)
        out, err = proc.communicate()
        row = {"tool": tool, "frame_size_bytes": size, **res}
        if tool == "fathom-traffic":
            doc = json.loads(out)
            row["own_report_pps"] = doc["tx"]["achieved_pps"]
            row["device_drops"] = doc["tx"]["device_drops"]
        return row


def compare(ns: str, ifname: str, dst_mac: str, src_mac: str, sizes: list[int], repeats: int, window_s: float,
            warmup_s: float = 0.5, cpu: int = 0, step=lambda s: None) -> tuple[list[dict], list[dict]]:
    """Interleaved runs of both tools (their order alternates per repeat); per-run rows and per-size ratios."""
    if not Path(TRAFGEN).exists():
        raise BenchError(f"{TRAFGEN} is missing: install the Debian package netsniff-ng")
    rows = []
    for rep in range(repeats):
        for size in sizes:
            order = TOOLS if rep % 2 == 0 else TOOLS[::-1]
            for tool in order:
                step(f"generator: {tool} at {size} B ({rep + 1}/{repeats})")
                rows.append({**run_once(tool, ns, ifname, size, dst_mac, src_mac, cpu, warmup_s, window_s),
                             "repeat": rep})
    return rows, ratios(rows)


def ratios(rows: list[dict]) -> list[dict]:
    """Per frame size: ours/trafgen per repeat (the two runs of one repeat are back to back), for the rate
    and for frames per CPU-second, and the median of those ratios with its min and max."""
    out = []
    for size in sorted({r["frame_size_bytes"] for r in rows}):
        by_rep: dict[int, dict] = {}
        for r in rows:
            if r["frame_size_bytes"] == size:
                by_rep.setdefault(r["repeat"], {})[r["tool"]] = r
        pairs = [(v["fathom-traffic"], v["trafgen"]) for _, v in sorted(by_rep.items())
                 if "fathom-traffic" in v and "trafgen" in v and v["trafgen"]["pps"] > 0]
        if not pairs:
            continue
        row = {"frame_size_bytes": size, "repeats": len(pairs),
               "ours_pps_median": round(statistics.median(o["pps"] for o, _ in pairs), 1),
               "trafgen_pps_median": round(statistics.median(t["pps"] for _, t in pairs), 1)}
        for key, name in (("pps", "ours_over_trafgen"), ("frames_per_cpu_s", "per_cpu_ours_over_trafgen")):
            per_run = [o[key] / t[key] for o, t in pairs if o.get(key) and t.get(key)]
            if per_run:
                row.update({f"{name}_median": round(statistics.median(per_run), 3),
                            f"{name}_min": round(min(per_run), 3), f"{name}_max": round(max(per_run), 3),
                            f"{name}_per_repeat": [round(x, 3) for x in per_run]})
        out.append(row)
    return out
