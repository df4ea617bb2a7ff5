"""Distributions over PPTMon records: per VNF and end to end (the sum over the chain)."""
from __future__ import annotations

import math
from collections import defaultdict

from fathom.stats import percentile


def summarize(values: list[float]) -> dict:
    v = sorted(values)
    n = len(v)
    if not n:
        return {"count": 0}
    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else 0.0
    return {"count": n, "min_us": v[0], "p50_us": percentile(v, 50), "p90_us": percentile(v, 90),
            "p99_us": percentile(v, 99), "p99_9_us": percentile(v, 99.9), "max_us": v[-1],
            "mean_us": mean, "stddev_us": sd}


def chain_stats(records: list[dict]) -> dict:
    """{'vnfs': {vnf_id: summary}, 'e2e': summary, 'records': n, 'incomplete': n}."""
    per: dict[int, list[float]] = defaultdict(list)
    e2e: list[float] = []
    incomplete = 0
    for r in records:
        for h in r.get("hops", []):
            if h.get("ppt_us") is not None:
                per[int(h["vnf"])].append(float(h["ppt_us"]))
        if r.get("e2e_us") is None:
            incomplete += 1
        else:
            e2e.append(float(r["e2e_us"]))
    return {"records": len(records), "incomplete": incomplete,
            "vnfs": {k: summarize(per[k]) for k in sorted(per)}, "e2e": summarize(e2e)}
