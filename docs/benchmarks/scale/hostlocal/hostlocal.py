"""What the controller's host-local statuses cost a pass at 100 nodes x 100 ports (the scale
bench's layout: 10,000 ports, 100 networks, 1,000 DHCP servers), with every agent reporting every
object applied: `fathom.controller.status.hostlocal` and `.dhcp_servers` digesting each object
afresh (`digest([obj])`, as before) and with the digests kept from pass to pass
(`fathom.model.hostlocal.Digests`), alternating, five rounds each, on a copy of the snapshot per
round whose objects are all new (so digests are found by value, not by identity). The collector
is set as the controller sets it (young collections every 50,000 allocations; what was built before
the rounds frozen). Run from the repository:

    .venv/bin/python docs/benchmarks/scale/hostlocal/hostlocal.py > docs/benchmarks/scale/hostlocal/rebuilt-each-round.json

(`results.json` is an earlier run, whose `desired` times included building the snapshot.)

Then the desired state itself as a pass and a long-poll read follow the store: each round one new
port bound to a node (the other Port objects the same as the round before, as the store reader
keeps them), the host-local desired state worked out from nothing (`desired`) and kept
(`Desired`), alternating on the same snapshots; and every node's digest and JSON for the agents'
long-polls (`fathom.api.agents.DesiredCache._entries`) from nothing and kept:

    .venv/bin/python docs/benchmarks/scale/hostlocal/hostlocal.py --follow > docs/benchmarks/scale/hostlocal/follow.json
"""
import gc
import json
import platform
import statistics
import sys
import time
from dataclasses import replace

from fathom.api.agents import AgentHub, DesiredCache
from fathom.apps.hostlocal import Desired
from fathom.apps.hostlocal import desired as hostlocal_desired
from fathom.bench.scale import Size, layout, layout_snapshot
from fathom.controller import status
from fathom.model import FixedIp, Port, Snapshot
from fathom.model.hostlocal import Digests, digest, owner_key
from fathom.store.agents import AgentView

size = Size(100, 100)
ports = layout(size)
n_networks = max(p[2] for p in ports) + 1


def snapshot() -> Snapshot:
    return layout_snapshot(size)




def follow(rounds: int = 10) -> dict:
    base = snapshot()
    ports = list(base.ports)
    kept, cache_fresh, cache_kept = Desired(), DesiredCache(AgentHub(), None), DesiredCache(AgentHub(), None)
    first = kept(base)
    cache_kept._nodes = cache_kept._entries(first)
    gc.set_threshold(50_000, 20, 10)
    gc.freeze()
    now = time.time()
    agents = {node: AgentView(node, 1, 1, {}, {owner_key(o.owner): {"status": "active", "reason": None,
                                                                      "applied": digest([o])} for o in objects},
                              now, now) for node, objects in first.items()}
    digests = Digests()
    times: dict[str, list[float]] = {"desired": [], "desired_kept": [], "entries": [], "entries_kept": [],
                                     "statuses_kept": []}
    for r in range(rounds):
        ports.append(Port(ports[-1].id + 1, f"new{r}", "p", 1, f"02:01:00:00:00:{r:02x}",
                          (FixedIp(1, f"10.0.2.{r + 1}"),), f"s{r % size.nodes}", f"new{r}"))
        snap = replace(base, ports=tuple(ports))
        t = time.perf_counter()
        want = hostlocal_desired(snap)
        times["desired"].append(time.perf_counter() - t)
        t = time.perf_counter()
        got = kept(snap)
        times["desired_kept"].append(time.perf_counter() - t)
        assert got == want
        t = time.perf_counter()
        status.hostlocal(got, agents, now, 60, digests)
        status.dhcp_servers(got, agents, now, 60, digests)
        digests.next_round()
        times["statuses_kept"].append(time.perf_counter() - t)
        t = time.perf_counter()
        fresh = cache_fresh._entries(want)
        times["entries"].append(time.perf_counter() - t)
        t = time.perf_counter()
        cache_kept._nodes = cache_kept._entries(got)
        times["entries_kept"].append(time.perf_counter() - t)
        assert {n: e[1:] for n, e in fresh.items()} == {n: e[1:] for n, e in cache_kept._nodes.items()}
    return {
        "what": "host-local desired state and the long-polls' digests and JSON, 100 x 100 layout, one new port a round",
        "ports": len(ports), "rounds": rounds, "python": platform.python_version(), "machine": platform.machine(),
        "ms": {k: [round(1000 * v, 2) for v in vs] for k, vs in times.items()},
        "median_ms": {k: round(1000 * statistics.median(vs), 2) for k, vs in times.items()},
        "note": "'entries' starts from an empty cache each round (every node digested and encoded); "
                "'entries_kept' from the round before's; 'statuses_kept': the pass's host-local statuses "
                "of the kept objects with the digests kept (the first round digests everything)",
    }


if "--follow" in sys.argv:
    print(json.dumps(follow(), indent=1))
    sys.exit(0)

now = time.time()
first = hostlocal_desired(snapshot())
agents = {node: AgentView(node, 1, 1, {}, {owner_key(o.owner): {"status": "active", "reason": None,
                                                                  "applied": digest([o])} for o in objects}, now, now)
          for node, objects in first.items()}
kept = Digests()
gc.set_threshold(50_000, 20, 10)     # as fathom.controller.server
gc.freeze()
times: dict[str, list[float]] = {"desired": [], "fresh": [], "kept": []}
for _ in range(5):
    for how in ("fresh", "kept"):
        snap = snapshot()
        t = time.perf_counter()
        want = hostlocal_desired(snap)
        times["desired"].append(time.perf_counter() - t)
        digest_of = kept if how == "kept" else None
        t = time.perf_counter()
        statuses = status.hostlocal(want, agents, now, 60, digest_of)
        status.dhcp_servers(want, agents, now, 60, digest_of)
        times[how].append(time.perf_counter() - t)
        if digest_of is not None:
            kept.next_round()        # a pass's end (the fresh rounds are not passes of the kept digests)
        assert all(st == ("active", None) for st in statuses.values())
print(json.dumps({
    "what": "host-local statuses of one pass, 100 x 100 layout, every agent reporting every object applied",
    "objects": sum(map(len, first.values())), "ports": len(ports), "networks": n_networks,
    "python": platform.python_version(), "machine": platform.machine(),
    "ms": {k: [round(1000 * v, 2) for v in vs] for k, vs in times.items()},
    "median_ms": {k: round(1000 * statistics.median(vs), 2) for k, vs in times.items()},
    "gc": "threshold (50000, 20, 10), objects built before the rounds frozen (as the controller)",
    "note": "the first 'kept' round digests everything (nothing kept yet); later rounds find every object",
}, indent=1))
