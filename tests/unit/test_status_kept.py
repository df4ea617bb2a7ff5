"""Ports' statuses kept from pass to pass (fathom.controller.status.PortStatuses): over a random
walk of changes (ports created, deleted, rebound, plugged and unplugged; the switches holding a
port's flows; a switch in trouble; a refused owner), `decide` with what it kept equals `decide`
from nothing, and decides again only the ports a change reached while the switches in trouble and
the refused owners stay as they were."""
from __future__ import annotations

import random
from dataclasses import replace

from fathom.apps.base import BR_INT, SwitchKey
from fathom.bench.scale.fabric import Size, layout_result, layout_snapshot
from fathom.controller import status
from fathom.controller.results import PassResult
from fathom.pipeline import cookies as ck

STEPS = 200


def result_for(snap, needs: dict, trouble: str | None, refused: int | None) -> PassResult:
    res = layout_result(snap)
    if trouble is not None:
        res.switches[SwitchKey(BR_INT, trouble)].state = "lost: connection closed"
    if refused is not None:
        res.refused[(ck.KIND_PORT, refused)] = "br-int s0: refused"
    res.needs = needs
    return res


def test_kept_port_statuses_equal_a_whole_decision():
    rng = random.Random(5)
    snap = layout_snapshot(Size(4, 6), plugged=True)
    keys = [SwitchKey(BR_INT, n.name) for n in snap.nodes]
    needs = {(ck.KIND_PORT, p.id): set(keys) for p in snap.ports}
    kept = status.PortStatuses()
    trouble = refused = None
    next_id = max(p.id for p in snap.ports) + 1
    for step in range(STEPS):
        changed: set = set()
        ports = list(snap.ports)
        what = rng.choice(("add", "delete", "rebind", "unplug", "plug", "needs", "needs", "trouble", "refused"))
        if what == "add":
            p = replace(rng.choice(ports), id=next_id, name=f"n{next_id}")
            next_id += 1
            ports.append(p)
            needs[(ck.KIND_PORT, p.id)] = set(keys)
            changed.add((ck.KIND_PORT, p.id))
        elif what == "delete" and len(ports) > 3:
            p = ports.pop(rng.randrange(len(ports)))
            needs.pop((ck.KIND_PORT, p.id), None)
            changed.add((ck.KIND_PORT, p.id))
        elif what == "rebind":
            i = rng.randrange(len(ports))
            ports[i] = replace(ports[i], node=rng.choice([n.name for n in snap.nodes] + [None]))
        elif what in ("plug", "unplug"):
            node = rng.choice(snap.nodes)
            iface = f"vm{rng.randrange(6)}"
            ofports = {**node.ofports, iface: 10 + int(iface[2:])} if what == "plug" else \
                {i: o for i, o in node.ofports.items() if i != iface}
            snap = replace(snap, nodes=tuple(replace(n, ofports=ofports) if n is node else n for n in snap.nodes))
        elif what == "needs":
            p = rng.choice(ports)
            o = (ck.KIND_PORT, p.id)
            if needs.get(o):
                needs[o] = set(rng.sample(keys, rng.randrange(len(keys))))
                if not needs[o]:
                    del needs[o]
            else:
                needs[o] = {rng.choice(keys)}
            changed.add(o)
        elif what == "trouble":
            trouble = None if trouble else rng.choice(snap.nodes).name
        elif what == "refused":
            refused = None if refused else rng.choice(ports).id
        snap = replace(snap, ports=tuple(sorted(ports, key=lambda p: p.id)))
        res = result_for(snap, needs, trouble, refused)
        res.needs_changed = changed
        whole_before = kept.passes["whole"]
        assert status.decide(snap, res, kept) == status.decide(snap, result_for(snap, needs, trouble, refused)), \
            f"step {step}: {what}"
        if what in ("add", "delete", "rebind", "plug", "unplug", "needs") and step:
            # trouble and refused as the pass before left them: only the changed ports again
            assert kept.passes["whole"] == whole_before, f"step {step}: {what}"
    assert kept.passes["changed"] > STEPS // 2


def test_every_port_is_decided_when_what_changed_is_not_known():
    snap = layout_snapshot(Size(2, 3), plugged=True)
    keys = {SwitchKey(BR_INT, n.name) for n in snap.nodes}
    needs = {(ck.KIND_PORT, p.id): keys for p in snap.ports}
    kept = status.PortStatuses()
    status.decide(snap, result_for(snap, needs, None, None), kept)      # needs_changed unknown
    res = result_for(snap, needs, None, None)
    res.needs_changed = set()
    status.decide(snap, res, kept)
    assert kept.passes == {"whole": 1, "changed": 1}
    status.decide(snap, result_for(snap, needs, None, None), kept)
    assert kept.passes == {"whole": 2, "changed": 1}
