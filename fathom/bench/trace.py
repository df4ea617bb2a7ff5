"""`fathom bench trace`: how long a simulated trace (fathom.trace) takes at scale.

The model is bench scale's (fathom.bench.scale.fabric.layout_snapshot): NODES compute nodes with
PORTS each, every port plugged, networks spanning ten nodes, compiled once as the controller
compiles it (fathom.apps.compile_all), with tunnels and a `default` security group per network (`as_a_cloud`). Then `samples` traces from a random port to a random other
port of its network (a seeded draw: same node or across the tunnel as it falls), each timed in
wall-clock and in CPU time of this process, as `POST /v1/traces` runs it after the controller's
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
    wall, cpu, verdicts, hops = [], [], {}, []
    progress(f"{samples} traces")
    for _ in range(samples):
        src = rng.choice(snapshot.ports)
        dst = rng.choice([p for p in by_network[src.network_id] if p.id != src.id])
        w0, c0 = time.perf_counter(), time.process_time()
        result = trace(snapshot, states, src, dst.fixed_ips[0].ip_address)
        wall.append((time.perf_counter() - w0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        v = result["verdict"]
        key = v["result"] if v["result"] != "delivered" or v["port"] == dst.name else "delivered elsewhere"
        verdicts[key] = verdicts.get(key, 0) + 1
        hops.append(len(result["hops"]))
    activity.append(machine_activity(("fathom bench trace",)))
    return {"benchmark": "trace", "plan": {"nodes": nodes, "ports_per_node": ports, "samples": samples, "seed": seed},
            "model": {"ports": len(snapshot.ports), "networks": len(snapshot.networks), "switches": len(flows),
                      "flows_per_switch": dist(flows), "compile_s": round(compile_s, 3)},
            "trace_ms": {"wall": dist(wall), "cpu": dist(cpu)}, "hops": dist(hops), "verdicts": verdicts,
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
    w, c = doc["trace_ms"]["wall"], doc["trace_ms"]["cpu"]
    plan = doc["plan"]
    return "\n".join([
        f"# fathom bench trace: {plan['nodes']} nodes x {plan['ports_per_node']} ports",
        "",
        f"{doc['model']['ports']} ports, {doc['model']['networks']} networks, "
        f"{doc['model']['flows_per_switch']['p50']:.0f} flows per br-int (p50); compiled in {doc['model']['compile_s']} s.",
        "",
        "| simulated trace | p50 | p99 | max | mean |",
        "|---|---|---|---|---|",
        f"| wall clock, ms | {w['p50']:.2f} | {w['p99']:.2f} | {w['max']:.2f} | {w['mean']:.2f} |",
        f"| CPU, ms | {c['p50']:.2f} | {c['p99']:.2f} | {c['max']:.2f} | {c['mean']:.2f} |",
        "",
        f"{w['n']} traces, verdicts {doc['verdicts']}; target p50 ≤ {doc['target_p50_ms']:g} ms: "
        f"{'met' if w['p50'] <= doc['target_p50_ms'] else 'NOT met'}"
        + (" (busy machine: load average above 1 or other labs running)" if doc["busy_machine"] else ""),
        ""])
