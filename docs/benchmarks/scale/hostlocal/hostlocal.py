"""What the controller's host-local statuses cost a pass at 100 nodes x 100 ports (the scale
bench's layout: 10,000 ports, 100 networks, 1,000 DHCP servers), with every agent reporting every
object applied: `fathom.controller.status.hostlocal` and `.dhcp_servers` digesting each object
afresh (`digest([obj])`, as before) and with the digests kept from pass to pass
(`fathom.model.hostlocal.Digests`), alternating, five rounds each, on a copy of the snapshot per
round (as a pass gets). The collector is set as the controller sets it (young collections every
50,000 allocations; what was built before the rounds frozen). Run from the repository:

    .venv/bin/python docs/benchmarks/scale/hostlocal/hostlocal.py > docs/benchmarks/scale/hostlocal/results.json
"""
import gc
import json
import platform
import statistics
import time

from fathom.apps.hostlocal import desired as hostlocal_desired
from fathom.bench.scale import Size, layout
from fathom.controller import status
from fathom.model import FixedIp, Network, Node, Port, Snapshot, Subnet
from fathom.model.hostlocal import Digests, digest, owner_key
from fathom.store.agents import AgentView

size = Size(100, 100)
ports = layout(size)
n_networks = max(p[2] for p in ports) + 1


def snapshot() -> Snapshot:
    nodes = tuple(Node(i + 1, f"s{i}", "compute", f"10.99.0.{i + 1}", f"198.18.0.{i + 1}", "complete")
                  for i in range(size.nodes))
    networks = tuple(Network(k + 1, f"net{k}", "p", "vxlan", 100 + k) for k in range(n_networks))
    subnets = tuple(Subnet(k + 1, f"s{k}", "p", k + 1, f"10.{k >> 6}.{(k & 63) * 4}.0/22",
                           f"10.{k >> 6}.{(k & 63) * 4}.1") for k in range(n_networks))
    count, out = {}, []
    for i, (n, j, k) in enumerate(ports):
        c = count[k] = count.get(k, 0) + 1
        ip = f"10.{k >> 6}.{(k & 63) * 4 + (c + 2) // 256}.{(c + 2) % 256}"
        out.append(Port(i + 1, f"p{n}-{j}", "p", k + 1, f"02:00:00:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}",
                        (FixedIp(k + 1, ip),), f"s{n}", f"vm{j}"))
    return Snapshot(nodes, networks, subnets, tuple(out))


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
        t = time.perf_counter()
        want = hostlocal_desired(snapshot())
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
