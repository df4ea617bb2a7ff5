"""What a pass's "which owners changed, and their flows" costs at 100 nodes x 100 ports (the scale
bench's layout: 10,000 ports in 100 networks, every VIF plugged, every port in its project's
default security group: Neutron's four rules), in-process: the model after the pass before, then
the next one, with the reconciler's steps between them: `without_refused`, each app's
`touched(before, after)` and `compile_owners` of what it names. Two changes, each timed 15 times:

- `new port`: a port created with its VIF already plugged (the store's reader keeps every other
  port's object; every node's object is made again, as the pass's port numbers are);
- `plug`: a bound port's VIF gets its OpenFlow port number on its node.

The model before is itself the result of such a pass (its views as a pass leaves them). The
collector's thresholds are the controller's, what was built before is frozen. Prints one JSON
object; `flows` (the owners' flows compiled) tells that two versions computed the same. Run from
the repository:

    .venv/bin/python docs/benchmarks/scale/views/views.py > docs/benchmarks/scale/views/after.json
    PYTHONPATH=<worktree of the code before> .venv/bin/python docs/benchmarks/scale/views/views.py > …/before.json
"""
import gc
import json
import platform
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import fathom
from fathom.apps import compile_owners, registry
from fathom.bench.scale import Size, layout_snapshot
from fathom.controller.reconciler import GC_THRESHOLDS, without_refused
from fathom.model import SecurityGroup, SecurityGroupRule, Snapshot

ROUNDS = 15
full = layout_snapshot(Size(100, 100), plugged=True)
full = replace(full, ports=tuple(replace(p, security_groups=(1,)) for p in full.ports),
               security_groups=(SecurityGroup(1, "default", "p"),),
               security_group_rules=(SecurityGroupRule(1, 1, "egress", "IPv4"),
                                     SecurityGroupRule(2, 1, "egress", "IPv6"),
                                     SecurityGroupRule(3, 1, "ingress", "IPv4", remote_group_id=1),
                                     SecurityGroupRule(4, 1, "ingress", "IPv6", remote_group_id=1)))


def model(ports: tuple, unplugged: tuple = ()) -> Snapshot:
    """The layout with these ports, its nodes' port numbers as a pass reads them (new objects),
    without the VIFs of `unplugged` ports."""
    gone = {(p.node, p.interface) for p in unplugged}
    return replace(full, ports=ports).with_ofports(
        {n.name: {i: o for i, o in n.ofports.items() if (n.name, i) not in gone} for n in full.nodes})


def a_pass(before: Snapshot, after: Snapshot) -> tuple[Snapshot, int]:
    """The reconciler's steps from `before` (compiled by the pass before) to `after`."""
    if hasattr(after, "follow"):
        after.follow(before)
    compiled, _ = without_refused(after)
    if compiled is not after and hasattr(compiled, "follow"):
        compiled.follow(before)
    flows = 0
    for app in registry():
        if app.touched is None:
            continue
        owners = app.touched(before, compiled)
        if isinstance(owners, str):
            raise SystemExit(f"{app.name}: compiled whole ({owners})")
        if owners:
            flows += sum(len(st.flows) for st in compile_owners(app, compiled, frozenset(owners)).values())
    return compiled, flows


def main() -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    ports = full.ports
    cases = {"new port": (lambda: model(ports[:-2]), lambda: model(ports[:-1]), lambda: model(ports)),
             "plug": (lambda: model(ports, ports[-2:]), lambda: model(ports, ports[-1:]), lambda: model(ports))}
    out = {"python": platform.python_version(), "fathom": str(Path(fathom.__file__).parent),
           "commit": subprocess.run(["git", "-C", str(Path(fathom.__file__).parent), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip(),
           "layout": "100 x 100, default security group", "rounds": ROUNDS, "cases": {}}
    for name, (first, second, third) in cases.items():
        times, flows = [], set()
        for _ in range(ROUNDS):
            earlier, _ = a_pass(first(), first())          # a model whose views a pass made
            before, _ = a_pass(earlier, second())
            after = third()
            gc.collect()
            gc.freeze()
            t0 = time.perf_counter()
            _, n = a_pass(before, after)
            times.append(1000 * (time.perf_counter() - t0))
            gc.unfreeze()
            flows.add(n)
        out["cases"][name] = {"ms_median": round(statistics.median(times), 2), "ms_min": round(min(times), 2),
                              "ms_max": round(max(times), 2), "flows": sorted(flows)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
