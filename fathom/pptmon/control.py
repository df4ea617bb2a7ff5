"""Turn PPTMon on and off for a chain: one pptmon-loader process per VNF.

Guest mode attaches inside the VNF namespace (in0 ingress, out0 egress); host mode on the
host side of the VNF's veths (h<k>i egress = into the VNF, h<k>o ingress = out of it).
VNF 1 is the source, the last VNF the sink (a single VNF is source-sink).

Each loader writes JSON lines to <state>/<chain>/vnf<k>.jsonl: an "attached" line, "stats"
lines (counters, every second) and, for the sink, one "ppt" record per sampled packet.
Those files are the local record store until the agent delivers records to the controller;
every record already carries the chain, so it can be POSTed as it is.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from fathom.pptmon import native
from fathom.pptmon import chain as chainmod
from fathom.pptmon.chain import STATE_ROOT, Chain, ChainError, load

BPFFS = STATE_ROOT / ".bpffs"
PLACEMENTS = ("guest", "host")


def parse_period(text: str) -> int:
    """'1s', '500ms', '50us', '0' (every packet), '20/s' (a rate) -> nanoseconds."""
    t = text.strip().lower()
    m = re.fullmatch(r"([0-9.]+)\s*/\s*s", t)
    if m:
        rate = float(m.group(1))
        if rate <= 0:
            raise ValueError("rate must be positive")
        return int(round(1e9 / rate))
    m = re.fullmatch(r"([0-9.]+)\s*(ns|us|µs|ms|s)?", t)
    if not m:
        raise ValueError(f"bad period {text!r} (e.g. 1s, 100ms, 0, 20/s)")
    scale = {"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9, None: 1e9}[m.group(2)]
    return int(round(float(m.group(1)) * scale))


def _ensure_bpffs() -> Path:
    BPFFS.mkdir(parents=True, exist_ok=True)
    with open("/proc/mounts") as f:
        if any(line.split()[1] == str(BPFFS) and line.split()[2] == "bpf" for line in f):
            return BPFFS
    subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], check=True)
    return BPFFS


def _modes(n: int) -> list[str]:
    if n == 1:
        return ["source-sink"]
    return ["source"] + ["transit"] * (n - 2) + ["sink"]


def attach_points(chain: Chain, k: int, placement: str) -> tuple[str, str, str]:
    """(namespace, in point, out point) of VNF k."""
    if placement == "guest":
        return chain.vnf_ns(k), "in0:ingress", "out0:egress"
    return chain.host, f"h{k}i:egress", f"h{k}o:ingress"


def _pidfile(chain: Chain, k: int) -> Path:
    return chain.state_dir() / f"vnf{k}.pid"


def _is_our_loader(pid: int, pin: str) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(c.endswith(b"pptmon-loader") for c in cmd) and pin.encode() in cmd


def state(chain: Chain) -> dict | None:
    f = chain.state_dir() / "pptmon.json"
    return json.loads(f.read_text()) if f.exists() else None


def enable(name: str, period_ns: int, placement: str = "guest", mtu: int = 0) -> dict:
    """Start the loaders (or, if they run with the same placement, change the period)."""
    if placement not in PLACEMENTS:
        raise ChainError(f"placement is one of {PLACEMENTS}")
    if not native.LOADER.exists():
        raise ChainError(f"{native.LOADER} is missing: run 'make -C native/pptmon'")
    chain = load(name)
    cur = state(chain)
    if cur and cur["placement"] == placement and all(
            _is_our_loader(p, cur["pins"][i]) for i, p in enumerate(cur["pids"])):
        set_period(name, period_ns)
        return state(chain)  # type: ignore[return-value]
    if cur:
        disable(name)
    bpffs = _ensure_bpffs()
    d = chain.state_dir()
    pids, pins = [], []
    try:
        for k, mode in enumerate(_modes(chain.n), start=1):
            ns, pin_in, pin_out = attach_points(chain, k, placement)
            pin = str(bpffs / f"{chain.name}-vnf{k}")
            label = json.dumps({"chain": chain.name, "vnf_ns": chain.vnf_ns(k),
                                "placement": placement})[1:-1]
            cmd = [str(native.LOADER), "run", "--netns", ns, "--mode", mode, "--vnf-id", str(k),
                   "--in", pin_in, "--out", pin_out, "--period-ns", str(period_ns),
                   "--pin", pin, "--label", label, "--stats-interval", "1"]
            if mtu:
                cmd += ["--mtu", str(mtu)]
            out = open(d / f"vnf{k}.jsonl", "ab")
            err = open(d / f"vnf{k}.err", "wb")
            p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
            out.close()
            err.close()
            pids.append(p.pid)
            pins.append(pin)
            _pidfile(chain, k).write_text(str(p.pid))
            _wait_attached(chain, k, p)
    except Exception:
        _write_state(chain, placement, period_ns, pids, pins)
        disable(name, missing_ok=True)
        raise
    return _write_state(chain, placement, period_ns, pids, pins)


def _write_state(chain, placement, period_ns, pids, pins) -> dict:
    st = {"placement": placement, "period_ns": period_ns, "pids": pids, "pins": pins,
          "modes": _modes(chain.n), "started": time.time()}
    (chain.state_dir() / "pptmon.json").write_text(json.dumps(st, indent=2))
    return st


def _wait_attached(chain: Chain, k: int, p: subprocess.Popen, timeout: float = 30.0) -> None:
    # The kernel's verifier takes seconds on a busy host (6.5 s for one program at a load of 9 on
    # two cores): the same bound as the node agent's ATTACH_TIMEOUT.
    f = chain.state_dir() / f"vnf{k}.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            err = (chain.state_dir() / f"vnf{k}.err").read_text().strip()
            raise ChainError(f"loader for VNF {k} exited: {err}")
        with open(f, "rb") as fh:
            for line in fh:
                if b'"attached"' in line and f'"pid":{p.pid}'.encode() in line:
                    return
        time.sleep(0.02)
    raise ChainError(f"loader for VNF {k} did not attach within {timeout}s")


def set_period(name: str, period_ns: int) -> None:
    chain = load(name)
    st = state(chain)
    if not st:
        raise ChainError(f"PPTMon is not enabled on {name}")
    for pin in st["pins"]:
        subprocess.run([str(native.LOADER), "set", "--pin", pin, "--period-ns", str(period_ns)],
                       check=True, capture_output=True)
    st["period_ns"] = period_ns
    (chain.state_dir() / "pptmon.json").write_text(json.dumps(st, indent=2))


def disable(name: str, missing_ok: bool = False) -> int:
    """Stop this chain's loaders (by pid, checked against the command line); each one
    detaches its own filters on SIGTERM.  Returns how many were stopped."""
    d = STATE_ROOT / name
    f = d / "pptmon.json"
    if not f.exists():
        if missing_ok:
            return 0
        raise ChainError(f"PPTMon is not enabled on {name}")
    st = json.loads(f.read_text())
    stopped = []
    for pid, pin in zip(st["pids"], st["pins"]):
        if _is_our_loader(pid, pin):
            os.kill(pid, signal.SIGTERM)
            stopped.append((pid, pin))
    deadline = time.monotonic() + 3
    for pid, pin in stopped:
        while _is_our_loader(pid, pin) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _is_our_loader(pid, pin):
            os.kill(pid, signal.SIGKILL)
    for pid, _ in stopped:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    try:
        chain = Chain.from_json(json.loads((d / "chain.json").read_text()))
        for k in range(1, chain.n + 1):
            ns, pin_in, pin_out = attach_points(chain, k, st["placement"])
            # a loader killed hard leaves its filters: remove ours (by handle/priority)
            if os.path.exists(f"/run/netns/{ns}"):
                subprocess.run([str(native.LOADER), "detach", "--netns", ns, "--in", pin_in,
                                "--out", pin_out], capture_output=True)
            _pidfile(chain, k).unlink(missing_ok=True)
    except (OSError, ValueError):
        pass
    f.unlink()
    return len(stopped)


def down(name: str) -> list[str]:
    """Take a chain down: stop its loaders, then delete every namespace named '<name>-*'."""
    if not chainmod.NAME_RE.match(name):
        raise ChainError(f"refusing to remove {name!r}: chain names start with 'pp' or 'pa'")
    disable(name, missing_ok=True)
    return chainmod.remove(name)


# ---- reading what the loaders wrote ----------------------------------------------------

def read_lines(name: str, kinds=("ppt",)) -> list[dict]:
    d = STATE_ROOT / name
    out = []
    for f in sorted(d.glob("vnf*.jsonl")):
        with open(f) as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line still being written
                if rec.get("type") in kinds:
                    out.append(rec)
    return out


def records(name: str, since_ns: int = 0) -> list[dict]:
    return [r for r in read_lines(name) if r.get("time_ns", 0) >= since_ns]


def counters(name: str) -> dict[str, dict]:
    """Latest counters of each VNF's programs, keyed by VNF namespace."""
    last: dict[str, dict] = {}
    for r in read_lines(name, kinds=("stats",)):
        last[r.get("vnf_ns", "?")] = r["counters"]
    return last
