"""Running the C traffic engine (native/traffic/build/fathom-traffic) from Python."""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fathom.lab.sh import LabError

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "native" / "traffic" / "build" / "fathom-traffic"


L1_OVERHEAD = 20  # preamble + SFD + inter-frame gap, bytes


def pps_for(mbps: float, size: int) -> float:
    """Frames per second of `size` bytes that make `mbps` on the wire."""
    return mbps * 1e6 / ((size + L1_OVERHEAD) * 8)


def mbps_for(pps: float, size: int) -> float:
    """Mb/s on the wire of `pps` frames of `size` bytes."""
    return pps * (size + L1_OVERHEAD) * 8 / 1e6


class BenchError(LabError):
    """A benchmark cannot run as asked; the message says why and what to do."""


def engine_path() -> Path:
    if not ENGINE.exists():
        raise BenchError(f"{ENGINE} is missing: run 'make native' (or scripts/setup)")
    return ENGINE


@dataclass
class Port:
    """One end the engine sends from or receives on."""
    ns: str
    ifname: str
    mac: str = ""


def engine_args(tx: Port, rx: Port | None, *, size: int, rate_pps: float, count: int,
                dst_mac: str = "", vlan: int | None = None, flows: int = 1, stamp_every: int = 1,
                batch: int = 32, csv: str | None = None, extra: list[str] | None = None,
                buckets: bool = False, linger_s: float = 0.2, warmup_s: float = 0.05) -> list[str]:
    args = [str(engine_path()), "run" if rx else "gen", "--tx-ns", tx.ns, "--tx-if", tx.ifname,
            "--size", str(size), "--rate", f"{rate_pps:.3f}", "--count", str(int(count)),
            "--flows", str(flows), "--stamp-every", str(stamp_every), "--batch", str(batch),
            "--linger", str(linger_s), "--warmup", str(warmup_s), "--cpu-tx", "0", "--cpu-rx", "1"]
    if rx:
        args += ["--rx-ns", rx.ns, "--rx-if", rx.ifname]
    if dst_mac:
        args += ["--dst-mac", dst_mac]
    if vlan is not None:
        args += ["--vlan", str(vlan)]
    if csv:
        args += ["--csv", csv]
    if buckets:
        args.append("--buckets")
    return args + list(extra or [])


def run_engine(args: list[str], timeout: float = 300) -> dict:
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"traffic engine timed out after {timeout}s: {' '.join(args)}")
    if p.returncode != 0:
        raise BenchError(f"traffic engine failed: {p.stderr.strip() or p.returncode}")
    return json.loads(p.stdout)


def start_engine(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_engine(proc: subprocess.Popen, timeout: float = 300) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise BenchError("traffic engine did not finish")
    if proc.returncode != 0:
        raise BenchError(f"traffic engine failed: {err.strip() or proc.returncode}")
    return json.loads(out)


def iface_info(ns: str, ifname: str) -> dict:
    p = subprocess.run([str(engine_path()), "info", "--ns", ns, "--if", ifname], capture_output=True, text=True)
    if p.returncode != 0:
        raise BenchError(p.stderr.strip())
    return json.loads(p.stdout)
