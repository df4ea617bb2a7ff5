"""The kernel's own run-time statistics of BPF programs: what a program costs per packet.

With statistics on, the kernel times every run of every BPF program (two clock reads around it)
and adds up `run_time_ns` and `run_cnt` per program. They are turned on here with the
BPF_ENABLE_STATS command, not the `kernel.bpf_stats_enabled` sysctl: the kernel keeps them on
while the returned file descriptor is open and counts such holders apart from the sysctl, so the
sysctl is never changed, two benchmarks do not turn them off under each other, and a benchmark
killed midway leaves nothing on.

A loader's programs are found from its process: every BPF program file descriptor it holds has
`prog_id`, `run_time_ns` and `run_cnt` in /proc/<pid>/fdinfo/<fd>; bpftool names the ids.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import subprocess
from dataclasses import dataclass

BPF_ENABLE_STATS = 32          # enum bpf_cmd
BPF_STATS_RUN_TIME = 0         # enum bpf_stats_type
SYS_BPF = {"x86_64": 321, "aarch64": 280}


@contextlib.contextmanager
def enabled():
    """BPF run-time statistics on for the duration (and off after, unless another holder or the
    sysctl keeps them on)."""
    nr = SYS_BPF.get(platform.machine())
    if nr is None:
        raise RuntimeError(f"BPF statistics: no bpf syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    attr = ctypes.c_uint32(BPF_STATS_RUN_TIME)        # union bpf_attr.enable_stats.type
    fd = libc.syscall(nr, BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        err = ctypes.get_errno()
        raise RuntimeError(f"BPF statistics: BPF_ENABLE_STATS: {os.strerror(err)}")
    try:
        yield
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Count:
    run_cnt: int
    run_time_ns: int


def counts(pid: int) -> dict[int, Count]:
    """prog id -> its statistics, for every BPF program the process holds a descriptor of."""
    out = {}
    fds = f"/proc/{pid}/fd"
    for fd in os.listdir(fds):
        try:
            if os.readlink(f"{fds}/{fd}") != "anon_inode:bpf-prog":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        except OSError:          # closed meanwhile
            continue
        if "prog_id" in info:
            out[int(info["prog_id"])] = Count(int(info.get("run_cnt", 0)), int(info.get("run_time_ns", 0)))
    return out


def names(prog_ids) -> dict[int, str]:
    """prog id -> the program's name (bpftool)."""
    out = {}
    for i in prog_ids:
        r = subprocess.run(["bpftool", "prog", "show", "id", str(i), "-j"], capture_output=True, text=True)
        if r.returncode == 0:
            out[i] = json.loads(r.stdout).get("name", "")
    return out


def cost(before: Count, after: Count, seconds: float) -> dict:
    """One program's cost over a run of `seconds`: packets it ran on, ns per packet and the share of
    one core's time it took (ns per packet x packets/s / 1e9). Pure."""
    pkts, ns = after.run_cnt - before.run_cnt, after.run_time_ns - before.run_time_ns
    return {"packets": pkts, "packets_per_s": pkts / seconds if seconds > 0 else None,
            "ns_per_packet": ns / pkts if pkts else None, "run_time_ns": ns,
            "core_share": ns / (seconds * 1e9) if seconds > 0 else None}
