"""What deciding every object's status costs a pass at 100 nodes x 100 ports (the scale bench's
layout: 10,000 ports in 100 networks, every VIF plugged), each port's and network's flows on every
node's br-int (as the security groups' address clauses put them there), with every switch healthy
and with two in trouble (one's OpenFlow connection lost, one's OVSDB unreachable), a port refused
and one held by one of those switches only. `fathom.controller.status.decide` on the same inputs
fifteen times each (and, where decide keeps the ports' statuses, after one port was added with the
others' statuses kept from the pass before); the collector's thresholds (50,000, 20, 10) on both sides, and what was built
before frozen. Prints one JSON object; the statuses' digest tells that two versions decided the
same. Run from the repository:

    .venv/bin/python docs/benchmarks/scale/decide/decide.py > docs/benchmarks/scale/decide/after.json
    PYTHONPATH=<worktree of the code before> .venv/bin/python docs/benchmarks/scale/decide/decide.py > …/before.json
"""
import gc
import hashlib
import json
import platform
import statistics
import time
from dataclasses import replace

from fathom.apps.base import BR_INT, SwitchKey
from fathom.bench.scale import Size, layout_result, layout_snapshot
from fathom.controller import status
from fathom.controller.reconciler import PassResult
from fathom.model import Snapshot
from fathom.pipeline import cookies as ck

size = Size(100, 100)


def pass_result(snap: Snapshot, trouble: bool) -> PassResult:
    res = layout_result(snap)
    everywhere = frozenset(res.switches)
    res.needs = {(ck.KIND_PORT, p.id): everywhere for p in snap.ports}
    res.needs.update({(ck.KIND_NETWORK, n.id): everywhere for n in snap.networks})
    if trouble:
        res.switches[SwitchKey(BR_INT, "s3")].state = "lost: connection closed"
        res.switches[SwitchKey(BR_INT, "s4")].setup = "error"
        res.switches[SwitchKey(BR_INT, "s4")].reason = "OVSDB unreachable"
        res.needs[(ck.KIND_PORT, 7)] = frozenset({SwitchKey(BR_INT, "s3")})
        res.refused[(ck.KIND_PORT, 9)] = "br-int s0: refused"
    return res


def main() -> None:
    snap = layout_snapshot(size, plugged=True)
    results = {name: pass_result(snap, name == "two switches in trouble")
               for name in ("every switch healthy", "two switches in trouble")}
    gc.set_threshold(50_000, 20, 10)
    gc.freeze()
    out = {"what": "status.decide over a 100 x 100 snapshot, 15 times each", "ports": len(snap.ports),
           "python": platform.python_version(), "ms": {}, "median_ms": {}, "statuses_digest": {}}
    for name, res in results.items():
        times = []
        for _ in range(15):
            t = time.perf_counter()
            decided = status.decide(snap, res)
            times.append(round(1000 * (time.perf_counter() - t), 2))
        out["ms"][name] = times
        out["median_ms"][name] = statistics.median(times)
        out["statuses_digest"][name] = hashlib.sha256(
            json.dumps(sorted((str(k), v) for k, v in decided.items())).encode()).hexdigest()[:16]
    if hasattr(status, "PortStatuses"):
        # one port added since the pass before, every switch healthy: the other ports' statuses kept
        name, res = "a port added, the others' statuses kept", results["every switch healthy"]
        before = replace(snap, ports=snap.ports[:-1])
        added = (ck.KIND_PORT, snap.ports[-1].id)
        times = []
        for _ in range(15):
            kept = status.PortStatuses()
            res.needs_changed = None
            status.decide(before, res, kept)
            res.needs_changed = {added}
            t = time.perf_counter()
            decided = status.decide(snap, res, kept)
            times.append(round(1000 * (time.perf_counter() - t), 2))
        assert kept.passes == {"whole": 1, "changed": 1}
        out["ms"][name] = times
        out["median_ms"][name] = statistics.median(times)
        out["statuses_digest"][name] = hashlib.sha256(
            json.dumps(sorted((str(k), v) for k, v in decided.items())).encode()).hexdigest()[:16]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
