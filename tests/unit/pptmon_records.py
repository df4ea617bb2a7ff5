"""Test helpers: PPTMon records as the sink's loader writes them."""
from __future__ import annotations

import time


def record(i: int, hops=(3, 4), chain: str = "pa1", t_ns: int | None = None, vnf_ns: str | None = None,
           proto: str = "udp") -> dict:
    n = len(hops)
    times = list(hops)
    return {"type": "ppt", "v": 1, "chain": chain, "vnf_ns": vnf_ns or f"{chain}-vnf{n}",
            "placement": "guest", "ktime_ns": 10_000_000 + i, "time_ns": t_ns or time.time_ns(),
            "ifindex": 3, "sink_vnf": n, "seq": i % 65536, "flags": 0,
            "flow": {"family": 4, "proto": proto, "src": "198.18.230.1", "dst": "198.18.233.2",
                     "sport": 40000, "dport": 5201, "ip_id": i % 65536, "l4_len": 100},
            "hops": [{"vnf": k + 1, "ppt_us": t} for k, t in enumerate(times)],
            "e2e_us": None if None in times else sum(times)}
