"""The event-driven, incremental reconciler against fake switches (fathom.controller.fakeswitch):
real store, real API (TestClient), real compilers, real encoded OpenFlow messages.

Every pass here also compiles the model whole and asserts that the incrementally kept desired
state equals it (check_incremental, on in tests/unit/test_reconciler.Cloud), so each test below is
also a check that incremental = full after every change it makes.
"""
from __future__ import annotations

import gc
import threading
from dataclasses import replace
import time

import pytest

from fathom.apps import BR_INT, SwitchKey
from fathom.controller import reconciler as reconciler_module
from fathom.controller.extension import Extension
from fathom.controller.metrics import METRICS
from fathom.pipeline import cookies as ck
from fathom.store import ops

from .app_reads import models_compiled, problems_of
from .auth import headers_for
from .test_reconciler import LAB, Cloud, holds


@pytest.fixture
def cloud(tmp_path):
    """The default lab's cloud; every model its passes compile is then read by every app only as it
    declares (tests/unit/test_app_reads.py)."""
    c = Cloud(tmp_path, LAB / "default.yaml")
    models = models_compiled(c.rec)
    c.rec.run_pass()
    yield c
    c.close()
    assert not problems_of(models), "\n".join(problems_of(models))


def recomputes(cloud, app="tenant") -> dict[str, int]:
    return {k: v for k, v in cloud.rec.desired.recomputes.items() if k.startswith(app + ":")}


def plug(cloud, node: str, interface: str, ofport: int, tell: bool = True) -> None:
    """A VIF appears on a node's br-int; its OVSDB tells the controller (unless `tell` is False:
    the notification is lost)."""
    cloud.boot.ofports.setdefault(node, {})[interface] = ofport
    if tell:
        cloud.rec.ovsdb_changed(node, "ports")


def unplug(cloud, node: str, interface: str) -> None:
    del cloud.boot.ofports[node][interface]
    cloud.rec.ovsdb_changed(node, "ports")


def new_port(cloud, name: str, node: str, network: str = "blue", **extra) -> dict:
    return cloud.call("POST", "/ports", json={"network_id": cloud.ids["nets"][network], "name": name,
                                              "node": node, "interface_name": name, **extra})


def status(cloud, port_id: int) -> tuple[str, str | None]:
    got = cloud.get(f"/ports/{port_id}")
    return got["status"], got["status_reason"]


def in_sync(cloud) -> bool:
    return all(holds(cloud.switches.switches[r.dpid], cloud.rec.desired.states[key])
               for key, r in cloud.rec.results.items() if r.dpid in cloud.switches.switches)


def test_port_changes_compile_only_their_owners(cloud):
    before = recomputes(cloud)
    incremental = METRICS.incremental.labels("tenant")._value.get()
    p = new_port(cloud, "vm5", "compute1")
    plug(cloud, "compute1", "vm5", 20)
    cloud.rec.run_pass(audit=False)
    assert status(cloud, p["id"]) == ("active", None)
    cloud.call("PATCH", f"/ports/{p['id']}", json={"port_security": False, "security_groups": []})
    cloud.rec.run_pass(audit=False)
    cloud.call("PATCH", f"/ports/{p['id']}", json={"node": "compute2", "interface_name": "vm5b"})
    plug(cloud, "compute2", "vm5b", 21)
    cloud.rec.run_pass(audit=False)
    assert status(cloud, p["id"]) == ("active", None)
    unplug(cloud, "compute1", "vm1")            # the last-but-one port of blue on compute1
    cloud.rec.run_pass(audit=False)
    unplug(cloud, "compute1", "vm2")            # blue leaves compute1: its flood group goes
    cloud.rec.run_pass(audit=False)
    assert not cloud.br_int("compute1").read_groups()
    cloud.call("DELETE", f"/ports/{p['id']}")
    cloud.rec.run_pass(audit=False)
    assert in_sync(cloud)
    # none of these recompiled the tenant app whole, every one was compiled incrementally
    assert recomputes(cloud) == before
    assert METRICS.incremental.labels("tenant")._value.get() >= incremental + 6


def test_a_change_no_handler_covers_recompiles_whole_and_says_why(cloud):
    router = cloud.call("POST", "/routers", json={"name": "r9"})
    cloud.call("POST", f"/routers/{router['id']}/interfaces", json={"subnet_id": cloud.ids["subnets"]["blue"]})
    cloud.rec.run_pass(audit=False)
    assert recomputes(cloud).get("tenant: routers changed") == 1
    assert in_sync(cloud)


def test_a_port_is_down_until_its_vif_is_plugged_then_active(cloud):
    p = new_port(cloud, "vm5", "compute1")
    cloud.rec.run_pass(audit=False)
    assert status(cloud, p["id"]) == ("down", "interface 'vm5' is not plugged on node compute1")
    unbound = cloud.call("POST", "/ports", json={"network_id": cloud.ids["nets"]["blue"], "name": "loose"})
    cloud.rec.run_pass(audit=False)
    assert status(cloud, unbound["id"]) == ("down", "not bound to a node")
    plug(cloud, "compute1", "vm5", 20)          # the VIF appears: OVSDB wakes the reconciler
    cloud.rec.run_pass(audit=False)
    assert status(cloud, p["id"]) == ("active", None)
    unplug(cloud, "compute1", "vm5")
    cloud.rec.run_pass(audit=False)
    assert status(cloud, p["id"])[0] == "down"
    # its flows left compute1 with it
    assert not [f for f in cloud.br_int("compute1").read_flows()
                if f.cookie == ck.cookie(ck.APP_TENANT, ck.KIND_PORT, p["id"]) and f.table == 0]


def test_a_vif_plugged_before_its_port_exists_compiles_nothing_then_its_port_is_active(cloud):
    """OpenStack's other order (the VIF first): an interface no port names changes no flow, so its
    pass compiles and sends nothing; the port created afterwards is active at once."""
    desired = dict(cloud.rec.desired.states)
    compiled = METRICS.incremental.labels("tenant")._value.get()
    plug(cloud, "compute1", "early1", 31)
    cloud.rec.run_pass(audit=False)
    assert METRICS.incremental.labels("tenant")._value.get() == compiled
    assert cloud.rec.desired.states == desired and cloud.rec.model.nodes != cloud.rec.desired.compiled_from.nodes
    p = new_port(cloud, "early1", "compute1")
    cloud.rec.run_pass(audit=False)
    assert status(cloud, p["id"]) == ("active", None)
    assert cloud.rec.desired.states != desired and in_sync(cloud)


class CountingAgents(Extension):
    """An extension that counts the passes that ran the agents' step."""

    def __init__(self):
        self.runs = 0

    def prepare(self, rec, snapshot, result):
        return snapshot

    def after_pass(self, rec, snapshot, result):
        self.runs += 1


def test_an_interface_no_object_names_runs_no_agent_and_writes_no_status(cloud):
    """A VIF plugged before its port exists (or one no port names) wakes a pass that compiles nothing:
    every status stands as the last pass decided it, so the pass runs no agent and writes none."""
    agents = CountingAgents()
    cloud.rec.extensions.append(agents)
    cloud.rec.run_pass(audit=False)
    before, statuses = cloud.rec.last, dict(cloud.rec.board.statuses)
    assert agents.runs == 1
    plug(cloud, "compute1", "early1", 31)
    cloud.rec.run_pass(audit=False)
    assert agents.runs == 1 and "statuses" not in cloud.rec.last_pass_steps
    assert cloud.rec.last.agents is before.agents and cloud.rec.board.statuses == statuses
    # the periodic check compares the replica with the model the pass kept: no drift
    assert dict(next(n for n in cloud.rec.model.nodes if n.name == "compute1").ofports)["early1"] == 31
    assert not cloud.rec.check() and cloud.rec.drift == {}
    # a switch lost meanwhile is news even with only an interface to tell: its node's status says so
    compute2 = cloud.br_int("compute2").dpid
    cloud.switches.disconnect(compute2)
    plug(cloud, "compute1", "early2", 32)
    cloud.rec.run_pass(audit=False)
    assert agents.runs == 2
    assert cloud.get(f"/nodes/{cloud.nodes['compute2']}")["status"] == "error"
    # and the interface a port names is news: the port goes active
    cloud.switches.add(compute2)
    cloud.rec.switch_changed(compute2)
    p = new_port(cloud, "vm5", "compute1")
    cloud.rec.run_pass(audit=False)
    assert status(cloud, p["id"])[0] == "down" and agents.runs == 3
    plug(cloud, "compute1", "vm5", 20)
    cloud.rec.run_pass(audit=False)
    assert status(cloud, p["id"]) == ("active", None) and agents.runs == 4


def test_long_poll_answers_when_the_status_is_reached_not_before(cloud):
    http = cloud.client
    p = new_port(cloud, "vm5", "compute1")
    # no pass yet: the status in the store predates the write, so the wait runs out
    t0 = time.monotonic()
    r = http.get(f"/v1/ports/{p['id']}", params={"wait": "active", "timeout": 0.3})
    assert r.status_code == 200 and r.json()["status"] != "active" and time.monotonic() - t0 >= 0.3
    loop = threading.Thread(target=cloud.rec.run_forever, daemon=True)
    loop.start()
    try:
        r = http.get(f"/v1/ports/{p['id']}", params={"wait": "active", "timeout": 0.5})
        assert r.json()["status"] == "down"          # a pass ran, but its VIF is not there
        threading.Timer(0.2, plug, (cloud, "compute1", "vm5", 20)).start()
        t0 = time.monotonic()
        r = http.get(f"/v1/ports/{p['id']}", params={"wait": "active", "timeout": 10})
        assert r.json()["status"] == "active" and time.monotonic() - t0 < 5
        # a status already reached answers at once; bad input is refused
        assert http.get(f"/v1/ports/{p['id']}", params={"wait": "active", "timeout": 10}).json()["status"] == "active"
        assert http.get(f"/v1/ports/{p['id']}", params={"wait": "up"}).status_code == 422
        assert http.get(f"/v1/ports/{p['id']}", params={"wait": "active", "timeout": 3600}).status_code == 422
        assert http.get("/v1/ports/999999", params={"wait": "active"}).status_code == 404
        # another project's port is as missing, at once: the wait starts only for a port one may see
        other = headers_for(cloud.api, project="someone-else", roles=("member",))
        t0 = time.monotonic()
        r = http.get(f"/v1/ports/{p['id']}", params={"wait": "down", "timeout": 5}, headers=other)
        assert r.status_code == 404 and time.monotonic() - t0 < 2
        # and so it is when the status it waits for is already there (answered with one read)
        r = http.get(f"/v1/ports/{p['id']}", params={"wait": "active", "timeout": 5}, headers=other)
        assert r.status_code == 404 and "active" not in r.text
    finally:
        cloud.rec.stop()
        loop.join(5)


def test_a_thousand_port_changes_coalesce_without_losing_one(cloud):
    """1,000 committed port changes in about a second (written to the store the way the API writes
    them, without HTTP in between so they really come that fast) while a client keeps reading
    through the API: few passes and bundles, the API never waits long, no change is lost."""
    ports = [new_port(cloud, f"x{i}", "compute1" if i % 2 else "compute2")["id"] for i in range(20)]
    for i in range(20):
        plug(cloud, "compute1" if i % 2 else "compute2", f"x{i}", 100 + i)
    cloud.rec.run_pass(audit=False)
    passes = cloud.rec.passes
    bundles = {d: len(s.sent) for d, s in cloud.switches.switches.items()}
    store = cloud.api.state.store
    loop = threading.Thread(target=cloud.rec.run_forever, daemon=True)
    reads: list[float] = []
    writing = threading.Event()

    def reader():
        while writing.is_set():
            t0 = time.monotonic()
            cloud.get(f"/ports/{ports[0]}")
            reads.append(time.monotonic() - t0)
    # the test process's own heap (every earlier test's objects) out of the collector's walks, as
    # the controller freezes its memory: a full collection of pytest's heap is not the reconciler
    gc.collect()
    gc.freeze()
    loop.start()
    writing.set()
    api_reader = threading.Thread(target=reader, daemon=True)
    api_reader.start()
    t0 = time.monotonic()
    try:
        for i in range(1000):
            change = {"port_security": bool(i % 3), "security_groups": []}
            store.write(lambda s, i=i, change=change: ops.update_port(s, ops.Caller(), ports[i % 20], change))
        took = time.monotonic() - t0
        deadline = time.monotonic() + 30
        while cloud.rec.board.covered < cloud.rec.board.requested and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        writing.clear()
        api_reader.join(10)
        cloud.rec.stop()
        loop.join(10)
        gc.unfreeze()
    for i, p in enumerate(ports):
        last = max(j for j in range(1000) if j % 20 == i)
        got = cloud.get(f"/ports/{p}")
        assert got["port_security"] == bool(last % 3) and got["status"] == "active", got
    cloud.rec.desired.assert_incremental(cloud.rec.desired.compiled_from)
    assert in_sync(cloud)
    # changes that arrived while a pass was busy went out together in the next one: a quiet machine
    # runs about 110 passes sending about 420 messages for the 1000 writes; the bounds are half of
    # one pass a write (and four messages a pass), as a loaded machine (the unit suite runs on
    # every core) lets fewer writes gather behind each pass
    ran = cloud.rec.passes - passes
    sent = sum(len(s.sent) - bundles[d] for d, s in cloud.switches.switches.items())
    print(f"1000 changes in {took:.2f} s: {ran} passes, {sent} bundles, {len(reads)} API reads, "
          f"slowest {max(reads):.3f} s")
    assert ran < 500 and sent < 2000
    assert reads and max(reads) < 2.0, f"an API read waited {max(reads):.2f} s behind the reconciler"


def test_a_burst_s_passes_start_a_period_apart_and_pause_at_least_as_long_as_they_took():
    """In a sustained burst a short pass is followed by a pause up to BURST_PERIOD from its start
    (its fixed cost paid for more changes), a long one by a pause as long (the API threads not
    starved), never longer than BURST_PAUSE."""
    from fathom.controller.reconciler import BURST_PAUSE, BURST_PERIOD, burst_pause
    assert burst_pause(0.01) == pytest.approx(BURST_PERIOD - 0.01)
    assert burst_pause(0.0) == pytest.approx(BURST_PERIOD)
    assert burst_pause(BURST_PERIOD) == pytest.approx(BURST_PERIOD)
    assert burst_pause(BURST_PAUSE / 2) == pytest.approx(BURST_PAUSE / 2)
    assert burst_pause(10 * BURST_PAUSE) == BURST_PAUSE


def test_a_switch_that_connects_during_a_burst_is_reconciled_without_the_burst_s_pause(cloud, monkeypatch):
    """In a sustained burst of writes the loop pauses between passes (BURST_PAUSE); a switch that
    connects, or whose master role this replica gains, ends the pause: its resync waits for no more
    writes (here the pause is made 30 s long)."""
    monkeypatch.setattr(reconciler_module, "BURST_PAUSE", 30.0)
    rec = cloud.rec
    run_pass = rec.run_pass

    def long_pass(*args, **kwargs):      # as if each pass took 30 s: the pause is as long
        result = run_pass(*args, **kwargs)
        time.sleep(0.02)                 # writes (every 2 ms) surely come while a pass runs: a
        rec.last_pass_seconds = 30.0     # 2 ms pass could fall between two of them, again and again
        return result
    monkeypatch.setattr(rec, "run_pass", long_pass)
    burst = threading.Event()

    def write():
        while burst.is_set():
            rec.wake()
            time.sleep(0.002)
    loop, writes = threading.Thread(target=rec.run_forever, daemon=True), threading.Thread(target=write)
    burst.set()
    loop.start()
    writes.start()
    try:
        deadline = time.monotonic() + 10
        while rec._busy < reconciler_module.BURST_PASSES and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rec._busy >= reconciler_module.BURST_PASSES, "no sustained burst"
        burst.clear()
        writes.join(5)
        time.sleep(0.2)                  # the loop is in its pause
        passes = rec.passes
        rec.switch_changed(cloud.br_int("compute1").dpid)
        deadline = time.monotonic() + 10
        while rec.passes == passes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rec.passes > passes, "the switch waited for the burst's pause"
    finally:
        burst.clear()
        rec.stop()
        loop.join(10)


def test_a_lost_ovsdb_event_is_caught_by_the_check(cloud):
    p = new_port(cloud, "vm5", "compute1")
    cloud.rec.run_pass(audit=False)
    plug(cloud, "compute1", "vm5", 20, tell=False)   # the notification is lost
    drift = cloud.rec.drift.get("ovsdb", 0)
    assert cloud.rec.check()
    assert cloud.rec.drift["ovsdb"] == drift + 1
    cloud.rec.run_pass(audit=False)
    assert status(cloud, p["id"]) == ("active", None)
    assert not cloud.rec.check()                      # and now nothing differs


def test_a_flow_removed_behind_our_back_is_caught_by_the_check(cloud):
    sw = cloud.br_int("compute1")
    victim = next(f for f in sw.read_flows() if ck.parse_cookie(f.cookie)[1] == ck.KIND_PORT)
    del sw.flows[victim.key]
    assert victim not in sw.read_flows()
    assert cloud.rec.check()
    assert cloud.rec.drift["openflow"] >= 1
    cloud.rec.run_pass(audit=False)
    assert victim in sw.read_flows()


def test_the_periodic_audit_reads_a_few_switches_back_in_turn_and_repairs_what_counts_miss(cloud, monkeypatch):
    """A flow whose actions someone else changed (the switch's flow count is the same: the check
    cannot see it) is found at its switch's turn of the audit, counted and repaired; each audit
    reads back its turn's switches only and compiles nothing whole; every switch gets its turn."""
    import fathom.controller.reconciler as rc
    monkeypatch.setattr(rc, "AUDIT_FLOWS", 1)     # one switch a turn
    sw = cloud.br_int("compute1")
    victim = next(f for f in sw.read_flows() if ck.parse_cookie(f.cookie)[1] == ck.KIND_PORT and f.actions)
    sw.flows[victim.key] = replace(victim, actions=())     # drops what it forwarded
    assert not cloud.rec.check()
    recomputes, drift = dict(cloud.rec.desired.recomputes), cloud.rec.drift.get("audit", 0)
    switches = {k: cloud.switches.switches[r.dpid] for k, r in cloud.rec.results.items()}
    assert len(switches) > 1
    turns = []
    for _ in switches:
        turn = cloud.rec.audit_turn()
        reads = {k: s.reads for k, s in switches.items()}
        cloud.rec.run_pass(audit=False, read_back=turn)
        assert {k for k, s in switches.items() if s.reads > reads[k]} == set(turn)
        turns.append(turn)
    assert [len(t) for t in turns] == [1] * len(switches) and set().union(*turns) == set(switches)
    assert victim in sw.read_flows()
    assert cloud.rec.drift["audit"] == drift + 1
    assert cloud.rec.desired.recomputes == recomputes


def test_a_refused_incremental_change_marks_exactly_its_object(cloud):
    sw = cloud.br_int("compute1")
    p = new_port(cloud, "vm5", "compute1")
    plug(cloud, "compute1", "vm5", 20)
    sw.refuse(lambda spec: ck.parse_cookie(spec.cookie)[1:] == (ck.KIND_PORT, p["id"]))
    cloud.rec.run_pass(audit=False)
    got = status(cloud, p["id"])
    assert got[0] == "error" and "br-int compute1" in got[1]
    for name, pid in cloud.ids["ports"].items():
        assert status(cloud, pid) == ("active", None), name
    # the switch is not trusted any more: the next pass reads it back (a full pass for it)
    assert sw.dpid not in cloud.rec.applier.known
    reads = sw.reads
    sw.refuse(None)
    cloud.rec.wake()
    cloud.rec.run_pass(audit=False)
    assert sw.reads == reads + 1
    assert status(cloud, p["id"]) == ("active", None)
    assert holds(sw, cloud.rec.desired.states[SwitchKey(BR_INT, "compute1")])


def test_a_reconnecting_switch_gets_one_bundle_that_never_drops_a_wanted_flow(cloud):
    sw = cloud.br_int("compute1")
    wanted = cloud.rec.desired.states[SwitchKey(BR_INT, "compute1")]
    cloud.switches.disconnect(sw.dpid)
    cloud.rec.switch_changed(sw.dpid)
    cloud.rec.run_pass(audit=False)
    # while it was away: one of our flows vanished, a stale one of ours appeared
    lost = next(f for f in sw.read_flows() if ck.parse_cookie(f.cookie)[1] == ck.KIND_PORT)
    del sw.flows[lost.key]
    stale = type(lost)(lost.table, 1, {"eth_dst": "02:00:00:00:00:99"}, (), lost.cookie)
    sw.add_foreign_flow(stale)
    sw.sent.clear()
    cloud.switches.add(sw.dpid)
    cloud.rec.switch_changed(sw.dpid)
    cloud.rec.run_pass(audit=False)
    assert [how for how, _ in sw.sent] == ["bundle"]
    msgs = sw.sent[0][1]
    ofp = sw.dp.ofproto
    deletes = [m for m in msgs if type(m).__name__ == "OFPFlowMod" and m.command == ofp.OFPFC_DELETE_STRICT]
    adds = [m for m in msgs if type(m).__name__ == "OFPFlowMod" and m.command == ofp.OFPFC_ADD]
    assert len(adds) == 1 and len(deletes) == 1 and msgs.index(adds[0]) < msgs.index(deletes[0])
    assert deletes[0].priority == 1                   # only the stale flow; nothing still wanted
    assert holds(sw, wanted)


def test_security_group_changes_compile_only_their_owners(cloud):
    """Ports joining and leaving groups, rules naming groups, groups made and deleted: each pass
    recompiles only the owners it touches (and check_incremental compares with a full compile)."""
    before = recomputes(cloud, "secgroups")
    p = new_port(cloud, "vm5", "compute1")                      # the project's default group
    plug(cloud, "compute1", "vm5", 20)
    cloud.rec.run_pass(audit=False)
    web = cloud.call("POST", "/security-groups", json={"name": "web", "project_id": p["project_id"]})
    cloud.rec.run_pass(audit=False)
    rule = cloud.call("POST", "/security-group-rules", json={
        "security_group_id": web["id"], "direction": "ingress", "ethertype": "IPv4", "protocol": "tcp",
        "port_range_min": 80, "port_range_max": 81, "remote_group_id": web["id"]})
    cloud.rec.run_pass(audit=False)
    # vm5 joins web: the first member (the rule starts matching), web comes to compute1
    cloud.call("PATCH", f"/ports/{p['id']}", json={"security_groups": [web["id"]]})
    cloud.rec.run_pass(audit=False)
    q = new_port(cloud, "vm6", "compute2", security_groups=[web["id"]])
    plug(cloud, "compute2", "vm6", 21)
    cloud.rec.run_pass(audit=False)
    sw = cloud.br_int("compute1")
    ip = q["fixed_ips"][0]["ip_address"]
    assert any(dict(f.match).get("ipv4_src") == ip for f in sw.read_flows()), "vm6's address reached compute1"
    cloud.call("POST", "/security-group-rules", json={
        "security_group_id": web["id"], "direction": "egress", "ethertype": "IPv4", "remote_ip_prefix": ip + "/32"})
    cloud.rec.run_pass(audit=False)                            # a prefix clause the same as a member's
    cloud.call("DELETE", f"/security-group-rules/{rule['id']}")
    cloud.rec.run_pass(audit=False)
    cloud.call("PATCH", f"/ports/{q['id']}", json={"port_security": False, "security_groups": []})
    cloud.rec.run_pass(audit=False)
    cloud.call("DELETE", f"/ports/{p['id']}")
    cloud.rec.run_pass(audit=False)
    cloud.call("DELETE", f"/security-groups/{web['id']}")
    cloud.rec.run_pass(audit=False)
    assert in_sync(cloud)
    assert recomputes(cloud, "secgroups") == before
    assert cloud.rec.mismatches == 0


def test_a_port_create_recompiles_only_its_own_security_group_flows(cloud):
    """The owners a new port of the default group touches: itself and one address clause per rule
    naming the group, whatever the group's size."""
    from fathom.apps.secgroups import touched
    for i in range(12):
        new_port(cloud, f"x{i}", "compute1")
        plug(cloud, "compute1", f"x{i}", 40 + i, tell=False)
    cloud.rec.ovsdb_changed("compute1", "ports")
    cloud.rec.run_pass(audit=False)
    model_before = cloud.rec.desired.compiled_from
    new_port(cloud, "vm9", "compute2")
    plug(cloud, "compute2", "vm9", 60)
    cloud.rec.run_pass(audit=False)
    owners = touched(model_before, cloud.rec.desired.compiled_from)
    kinds = sorted(ck.KINDS[o.kind] for o in owners)
    # the port itself, and the default group's two "from the group" rules' new address clause (IPv4)
    assert kinds.count("port") == 1 and kinds.count("security_group_clause") <= 2, kinds
    assert set(kinds) <= {"port", "security_group_clause"}, kinds


def test_an_api_write_reads_again_only_the_parts_of_the_store_it_wrote(cloud):
    reader = cloud.rec.store.reader
    for _ in range(2):   # the first passes wrote the nodes' bootstrap state (part of the model)
        cloud.rec.wake()
        cloud.rec.run_pass(audit=False)

    def read_again(fn) -> set[str]:
        """The parts read whole again, and ("patched", part) for a part patched by row."""
        before, patched = dict(reader.reads), dict(reader.patches)
        fn()
        return ({k for k, v in reader.reads.items() if v != before.get(k, 0)}
                | {("patched", k) for k, v in reader.patches.items() if v != patched.get(k, 0)})

    def port():
        p = new_port(cloud, "vm5", "compute1")
        plug(cloud, "compute1", "vm5", 20)
        cloud.rec.run_pass(audit=False)
        assert status(cloud, p["id"]) == ("active", None)
    assert read_again(port) == {("patched", "ports")}   # only that port's rows (it holds no gateway's address)
    # the pass's own status writes count for nothing: a pass without a write reads nothing
    assert read_again(lambda: cloud.rec.run_pass(audit=False)) == set()
    net = {}

    def network():
        net.update(cloud.call("POST", "/networks", json={"name": "green", "type": "vxlan"}))
        cloud.rec.run_pass(audit=False)
    # and the port patched just before
    assert read_again(network) == {"networks", ("patched", "ports")}
    assert read_again(lambda: cloud.rec.run_pass(audit=False)) == set()

    def delete_network():   # a delete also counts for the tables its foreign keys cascade to
        cloud.call("DELETE", f"/networks/{net['id']}")
        cloud.rec.run_pass(audit=False)
    assert read_again(delete_network) >= {"networks", "subnets"}
    # an explicit sync reads the whole store (rows written past the API are seen then)
    assert read_again(lambda: cloud.rec.run_pass(audit=True)) == set(reader.parts)
    assert in_sync(cloud)


@pytest.mark.parametrize("lab", ["sfc.yaml", "external.yaml", "default.yaml"])
def test_port_changes_leave_the_other_apps_incremental(tmp_path, lab):
    """Chains, taps, gateways and the fabric: a new port in a network already plugged on its node,
    plugged, unplugged, plugged again and deleted, and a VNF instance's port unplugged and plugged
    again: no app is compiled whole, and every pass equals a full compile (check_incremental)."""
    c = Cloud(tmp_path, LAB / lab, with_fabric=lab == "default.yaml", taps=True)
    models = models_compiled(c.rec)
    try:
        c.rec.run_pass()
        before = dict(c.rec.desired.recomputes)
        # a network plugged on a node already (a network coming to or leaving a node is a change
        # of the external and fabric apps' inputs: they are compiled whole then)
        model = c.rec.model
        vif = next(p for p in model.ports if p.node and c.boot.ofports.get(p.node, {}).get(p.interface)
                   and p.port_security)
        port = c.call("POST", "/ports", json={"network_id": vif.network_id, "name": "late", "node": vif.node,
                                              "interface_name": "late", "project_id": vif.project_id})
        plug(c, vif.node, "late", 99)
        c.rec.run_pass(audit=False)
        unplug(c, vif.node, "late")
        c.rec.run_pass(audit=False)
        plug(c, vif.node, "late", 98)
        c.rec.run_pass(audit=False)
        c.call("DELETE", f"/ports/{port['id']}")
        c.rec.run_pass(audit=False)
        if lab == "sfc.yaml":   # a VNF instance's port unplugged and plugged again: its chain only
            fw = next(p for p in model.ports if p.name == "fw1i")
            ofport = c.boot.ofports[fw.node][fw.interface]
            unplug(c, fw.node, fw.interface)
            c.rec.run_pass(audit=False)
            plug(c, fw.node, fw.interface, ofport)
            c.rec.run_pass(audit=False)
        assert c.rec.mismatches == 0
        assert c.rec.desired.recomputes == before, c.rec.desired.recomputes
        assert in_sync(c)
        assert not problems_of(models), "\n".join(problems_of(models))
    finally:
        c.close()


def test_compile_owners_of_every_app_is_its_whole_compile_cut_to_those_owners(tmp_path):
    """The hook and its fallback agree with the whole compile, owner by owner, for every app."""
    from fathom.apps import by_owner, compile_owners, registry
    from fathom.controller.desired import without_refused
    c = Cloud(tmp_path, LAB / "default.yaml", with_fabric=True, taps=True)
    try:
        c.rec.run_pass()
        model, _ = without_refused(c.rec.model)
        for app in registry():
            whole = app.compile(model)
            owners = {o for state in whole.values() for o in by_owner(state)}
            some = frozenset(sorted(owners)[::2])
            got = compile_owners(app, model, some)
            for key, state in whole.items():
                want = {o: s for o, s in by_owner(state).items() if o in some}
                assert by_owner(got.get(key, type(state)())) == want, (app.name, key)
    finally:
        c.close()


def test_a_flow_encoded_once_is_the_same_bytes_as_os_ken_encodes(cloud):
    from fathom.openflow.encode import Wire
    sw = cloud.br_int("compute1")
    for flow in list(sw.read_flows())[:50]:
        for command in ("add", "delete"):
            m = Wire(sw.dp, "flow", flow, command)
            ref = m.message()
            ref.set_xid(1234)
            ref.serialize()
            assert m.wire(1234) == bytes(ref.buf)
            assert m.wire(1234) == Wire(sw.dp, "flow", flow, command).wire(1234)


def test_a_dhcp_port_plugged_by_the_agent_brings_its_flows_incrementally(cloud):
    """The agent plugs a network's DHCP port (`dhp<N>`) on a node: its network's and its local
    ports' DHCP flows follow (the pass's check compares them with a full compile), and go when
    it is unplugged."""
    blue = cloud.ids["nets"]["blue"]
    incremental = METRICS.incremental.labels("tenant")._value.get()
    plug(cloud, "compute1", f"dhp{blue}", 40)
    cloud.rec.run_pass(audit=False)
    assert METRICS.incremental.labels("tenant")._value.get() > incremental
    flows = {f.to_ofctl() for f in cloud.rec.desired.states[SwitchKey(BR_INT, "compute1")].flows}
    assert any("in_port=40" in f for f in flows), "the DHCP port is not classified into its network"
    assert any("tp_src=68,tp_dst=67" in f and "set_field:0x28->reg7" in f for f in flows), \
        "local ports' DHCP requests are not sent to the DHCP port"
    unplug(cloud, "compute1", f"dhp{blue}")
    cloud.rec.run_pass(audit=False)
    flows = {f.to_ofctl() for f in cloud.rec.desired.states[SwitchKey(BR_INT, "compute1")].flows}
    assert not any("in_port=40" in f or "set_field:0x28->reg7" in f for f in flows)


def test_a_gateway_set_on_a_router_with_ports_brings_the_gateway_node_its_neighbours(cloud):
    """The gateway node routes what comes in from outside (a floating IP's traffic) into every
    network of the router: a gateway set after the router's ports exist gives it their neighbour
    entries (check_incremental: incremental = full after the pass)."""
    ext = cloud.call("POST", "/networks", json={"name": "ext", "type": "vlan", "segmentation_id": 300,
                                                "external": True, "upstream_mac": "02:fe:00:00:00:01"})
    cloud.call("POST", "/subnets", json={"network_id": ext["id"], "cidr": "203.0.113.0/24",
                                         "gateway_ip": "203.0.113.1", "name": "ext4"})
    router = cloud.call("POST", "/routers", json={"name": "r9"})
    cloud.call("POST", f"/routers/{router['id']}/interfaces", json={"subnet_id": cloud.ids["subnets"]["blue"]})
    cloud.rec.run_pass(audit=False)
    cloud.call("PATCH", f"/routers/{router['id']}", json={"external_gateway": {"network_id": ext["id"]}})
    cloud.rec.run_pass(audit=False)
    neighbours = [f for f in cloud.rec.desired.states[SwitchKey(BR_INT, "gw")].flows if f.table == 55]
    assert {dict(f.match).get("ipv4_dst") for f in neighbours} >= {"198.19.1.11", "198.19.1.13"}
    assert in_sync(cloud)
