"""`fathom bench trace`: how long a simulated trace (fathom.trace) takes at scale.

The model is bench scale's (fathom.bench.scale.fabric.layout_snapshot): NODES compute nodes with
PORTS each, every port plugged, networks spanning ten nodes, compiled once as the controller
compiles it (fathom.apps.compile_all), with tunnels and a `default` security group per network (`as_a_cloud`). Then `samples` traces from a random port to a random other
port of its network (a seeded draw: same node or across the tunnel as it falls), each timed in
wall-clock and in CPU time of this process, cold (the first trace through its switches since the
controller's pass: their tables are sorted then, fathom.trace.tables.tables_of) and warm (again), as `POST /v1/traces` runs it after the controller's
pass (the HTTP round trip and the caller's checks are not in the figure). Target: p50 ≤ 50 ms at
100 nodes × 100 ports.
"""
from __future__ import annotations

import random
import time

from fathom.bench.report import busy, dist, environment, machine_activity

TARGET_P50_MS = 50.0


def run(nodes: int = 100, ports: int = 100, samples: int = 200, seed: int = 1, progress=lambda msg: None) -> dict:
    from fathom.apps import compile_all
    from fathom.bench.scale.fabric import Size, layout_snapshot
    from fathom.trace import tables as tb
    from fathom.trace import trace

    env = environment()
    activity = [machine_activity(("fathom bench trace",))]
    progress(f"model: {nodes} nodes x {ports} ports")
    snapshot = as_a_cloud(layout_snapshot(Size(nodes, ports), plugged=True))
    t0 = time.perf_counter()
    states = compile_all(snapshot)
    compile_s = time.perf_counter() - t0
    flows = [len(s.flows) for s in states.values() if s is not None]
    by_network: dict[int, list] = {}
    for p in snapshot.ports:
        by_network.setdefault(p.network_id, []).append(p)
    rng = random.Random(seed)
    times: dict[str, dict[str, list]] = {k: {"wall": [], "cpu": []} for k in ("cold", "warm")}
    verdicts: dict[str, int] = {}
    hops = []
    progress(f"{samples} traces, each cold then warm")
    for _ in range(samples):
        src = rng.choice(snapshot.ports)
        dst = rng.choice([p for p in by_network[src.network_id] if p.id != src.id])
        tb.forget_tables()
        for kind in ("cold", "warm"):
            w0, c0 = time.perf_counter(), time.process_time()
            result = trace(snapshot, states, src, dst.fixed_ips[0].ip_address)
            times[kind]["wall"].append((time.perf_counter() - w0) * 1000)
            times[kind]["cpu"].append((time.process_time() - c0) * 1000)
        v = result["verdict"]
        key = v["result"] if v["result"] != "delivered" or v["port"] == dst.name else "delivered elsewhere"
        verdicts[key] = verdicts.get(key, 0) + 1
        hops.append(len(result["hops"]))
    activity.append(machine_activity(("fathom bench trace",)))
    return {"benchmark": "trace", "plan": {"nodes": nodes, "ports_per_node": ports, "samples": samples, "seed": seed},
            "model": {"ports": len(snapshot.ports), "networks": len(snapshot.networks), "switches": len(flows),
                      "flows_per_switch": dist(flows), "compile_s": round(compile_s, 3)},
            "trace_ms": {kind: {k: dist(v) for k, v in t.items()} for kind, t in times.items()},
            "hops": dist(hops), "verdicts": verdicts,
            "target_p50_ms": TARGET_P50_MS, "busy_machine": busy(activity),
            "environment": {**env, "machine": activity}}


def as_a_cloud(snapshot):
    """The layout as tenants' clouds: every node's tunnel port plugged (OpenFlow port 1, as bench
    scale's nodes have it) and every port in a `default` security group of its network's tenant
    with Neutron's rules (egress anything, ingress from the group's members), so a trace crosses
    every stage a tenant's packet crosses."""
    from dataclasses import replace

    from fathom.model import TUNNEL_INTERFACE, SecurityGroup, SecurityGroupRule
    groups = tuple(SecurityGroup(n.id, "default", "p") for n in snapshot.networks)
    rules = tuple(r for g in groups for r in (SecurityGroupRule(2 * g.id - 1, g.id, "egress", "IPv4"),
                                              SecurityGroupRule(2 * g.id, g.id, "ingress", "IPv4", remote_group_id=g.id)))
    return replace(snapshot, nodes=tuple(replace(n, ofports={**n.ofports, TUNNEL_INTERFACE: 1}) for n in snapshot.nodes),
                   ports=tuple(replace(p, security_groups=(p.network_id,)) for p in snapshot.ports),
                   security_groups=groups, security_group_rules=rules)


def markdown(doc: dict) -> str:
    plan = doc["plan"]
    rows = [f"| {kind}, {clock} | {d['p50']:.2f} | {d['p99']:.2f} | {d['max']:.2f} | {d['mean']:.2f} |"
            for kind, t in doc["trace_ms"].items() for clock, d in t.items()]
    w = doc["trace_ms"]["warm"]["wall"]
    return "\n".join([
        f"# fathom bench trace: {plan['nodes']} nodes x {plan['ports_per_node']} ports",
        "",
        f"{doc['model']['ports']} ports, {doc['model']['networks']} networks, "
        f"{doc['model']['flows_per_switch']['p50']:.0f} flows per br-int (p50); compiled in {doc['model']['compile_s']} s.",
        "Cold: the first trace through its switches after a pass (their tables sorted); warm: again.",
        "",
        "| simulated trace, ms | p50 | p99 | max | mean |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"{w['n']} port pairs, verdicts {doc['verdicts']}; target p50 ≤ {doc['target_p50_ms']:g} ms (warm, wall clock): "
        f"{'met' if w['p50'] <= doc['target_p50_ms'] else 'NOT met'}"
        + (" (busy machine: load average above 1 or other labs running)" if doc["busy_machine"] else ""),
        ""])
