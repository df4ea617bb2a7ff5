"""The apply part of the reconciler on its own (fathom.controller.apply.Applier), against fake
switches that take real OpenFlow messages (fathom.controller.fakeswitch): make on every switch
before break on any, a known switch told only the pass's edit, a refusal marking exactly its
owners, an audit finding and repairing drift, switches not connected or not set up left alone, and
a switch that does not answer (its commit, a read, a plain message's barrier, the check's count, a
status write's barrier) holding no pass, and many silent at once holding it one wait: each round's
requests asked of every switch before any is awaited (flow reads a bounded number at a time), a
tier's changes sent to SENDERS switches at once."""
from __future__ import annotations

from fathom.apps import BR_INT, FABRIC_SWITCH, SwitchKey
from fathom.controller.apply import SENDERS, Applier
from fathom.controller.fakeswitch import FakeSwitches
from fathom.controller.results import PassResult, SwitchResult
from fathom.model import Snapshot
import pytest

from fathom.openflow.spec import FlowSpec, MeterSpec, SwitchState
from fathom.pipeline import cookies as ck

TOR1, C1, C2 = SwitchKey(FABRIC_SWITCH, "tor1"), SwitchKey(BR_INT, "c1"), SwitchKey(BR_INT, "c2")
DPIDS = {TOR1: 0x10, C1: 0x20, C2: 0x30}


def owned(port: int, n: int = 3) -> frozenset:
    """Flows of port `port` (the tenant app's): one per in_port."""
    return frozenset(FlowSpec(0, 100, {"in_port": port * 10 + i}, (), ck.cookie(ck.APP_TENANT, ck.KIND_PORT, port))
                     for i in range(n))


class Bench:
    """An Applier over fake switches, with what it reported as drift."""

    def __init__(self, *keys: SwitchKey):
        self.switches = FakeSwitches()
        self.sw = {key: self.switches.add(DPIDS[key]) for key in keys}
        self.drift: list[tuple[str, str]] = []
        self.applier = Applier(self.switches, lambda source, what: self.drift.append((source, what)),
                               lambda: None, check_incremental=True)

    def apply(self, desired: dict, changed=None, edits=None, audit=False, keys=None, setup="ok") -> PassResult:
        result = PassResult(desired=dict(desired))
        for key in desired:
            result.switches[key] = SwitchResult(key, DPIDS[key], setup=setup)
        self.applier.apply(Snapshot(), result, set(desired) if keys is None else keys,
                           set(desired) if changed is None else changed, edits or {}, audit=audit)
        return result

    def ours(self, key: SwitchKey) -> set:
        return {f for f in self.sw[key].read_flows() if ck.owns_cookie(f.cookie)}


def flow_commands(entry) -> set[str]:
    """"add" and/or "delete" for the flow mods of one journal entry."""
    _dpid, _how, messages = entry
    return {"add" if m.command == m.datapath.ofproto.OFPFC_ADD else "delete"
            for m in messages if type(m).__name__ == "OFPFlowMod"}


def test_every_switch_makes_before_any_breaks_and_tiers_go_in_order():
    bench = Bench(TOR1, C1)
    bench.apply({TOR1: SwitchState(owned(1)), C1: SwitchState(owned(1))})
    bench.switches.journal.clear()
    result = bench.apply({TOR1: SwitchState(owned(2)), C1: SwitchState(owned(2))})
    assert all(r.state == "ok" and r.changes == 6 for r in result.switches.values())
    assert bench.ours(TOR1) == bench.ours(C1) == set(owned(2))
    order = [(entry[0], cmd) for entry in bench.switches.journal for cmd in sorted(flow_commands(entry))]
    # new state in from the fabric switch inwards, then old state out from the edge: fabric switch, c1 adds; c1, fabric switch deletes
    assert order == [(0x10, "add"), (0x20, "add"), (0x20, "delete"), (0x10, "delete")], order


def test_a_known_switch_is_sent_the_edit_only():
    bench = Bench(C1)
    before = SwitchState(owned(1) | owned(2))
    bench.apply({C1: before})
    assert bench.applier.diffs == {"edit": 0, "whole": 1}
    reads = bench.sw[C1].reads
    after = SwitchState(owned(1) | owned(3))
    edit = (before, SwitchState(owned(2)), SwitchState(owned(3)))
    result = bench.apply({C1: after}, edits={C1: edit})
    assert bench.applier.diffs == {"edit": 1, "whole": 1}     # checked against a whole diff (check_incremental)
    assert bench.sw[C1].reads == reads                       # nothing read back
    assert bench.ours(C1) == set(after.flows) and result.switches[C1].changes == 6
    assert bench.applier.known[DPIDS[C1]][2] is after         # the mirror is of the new state
    bench.apply({C1: after}, changed=set())                   # holds what it should: sent nothing
    assert bench.applier.diffs == {"edit": 1, "whole": 1}


def test_a_refusal_marks_its_owners_and_the_rest_is_applied():
    bench = Bench(C1)
    bench.sw[C1].refuse(lambda spec: ck.parse_cookie(spec.cookie)[2] == 2)
    result = bench.apply({C1: SwitchState(owned(1) | owned(2))})
    assert set(result.refused) == {(ck.KIND_PORT, 2)}
    assert result.switches[C1].state == "ok" and bench.ours(C1) == set(owned(1))
    assert bench.applier.refused_at[C1] == result.refused
    assert DPIDS[C1] not in bench.applier.known               # read back next pass
    bench.sw[C1].refuse(None)
    result = bench.apply({C1: SwitchState(owned(1) | owned(2))}, changed=set())
    assert result.refused == {} and C1 not in bench.applier.refused_at
    assert bench.ours(C1) == set(owned(1) | owned(2))


def test_an_audit_finds_drift_and_repairs_it():
    bench = Bench(C1)
    desired = SwitchState(owned(1))
    bench.apply({C1: desired})
    bench.sw[C1].flows.pop(next(iter(bench.sw[C1].flows)))   # behind our back
    bench.apply({C1: desired}, changed=set())
    assert bench.drift == [] and len(bench.ours(C1)) == 2     # not read back: trusted
    bench.apply({C1: desired}, changed=set(), audit=True)
    assert [source for source, _ in bench.drift] == ["audit"]
    assert bench.ours(C1) == set(desired.flows)


def test_the_check_finds_a_flow_count_that_differs_from_the_mirror():
    bench = Bench(C1)
    result = bench.apply({C1: SwitchState(owned(1))})
    res = result.switches[C1]
    assert bench.applier.check(res) is None
    bench.sw[C1].flows.pop(next(iter(bench.sw[C1].flows)))   # behind our back
    assert bench.applier.check(res) == "check" and [s for s, _ in bench.drift] == ["openflow"]
    assert DPIDS[C1] not in bench.applier.known               # the next pass diffs it whole
    bench.apply({C1: SwitchState(owned(1))}, changed=set())
    assert bench.ours(C1) == set(owned(1)) and bench.applier.check(res) is None
    res.state = "error: refused"
    bench.applier.known.clear()
    assert bench.applier.check(res) == "retry"                # connected, not reconciled


def test_switches_away_or_not_set_up_are_left_alone():
    bench = Bench(C1)
    result = bench.apply({C1: SwitchState(owned(1))}, setup="error")
    assert result.switches[C1].state == "not reconciled (bootstrap failed)" and bench.sw[C1].sent == []
    bench.switches.disconnect(DPIDS[C1])
    result = bench.apply({C1: SwitchState(owned(1))})
    assert result.switches[C1].state.startswith("lost: br-int's OpenFlow connection closed")
    away = Bench()
    result = away.apply({TOR1: SwitchState(owned(1))})
    assert result.switches[TOR1].state == "not connected"


def test_only_the_switches_given_are_reconciled():
    bench = Bench(TOR1, C1)
    bench.apply({TOR1: SwitchState(owned(1)), C1: SwitchState(owned(1))}, keys={TOR1})
    assert bench.ours(TOR1) == set(owned(1)) and bench.sw[C1].sent == []
    assert set(bench.applier.results) == {TOR1}
    bench.apply({TOR1: SwitchState(owned(1)), C1: SwitchState(owned(1))})
    assert set(bench.applier.results) == {TOR1, C1} and bench.ours(C1) == set(owned(1))
    bench.apply({TOR1: SwitchState(owned(1)), C1: SwitchState(owned(1))}, keys={TOR1})
    assert set(bench.applier.results) == {TOR1}          # a switch no longer reconciled is forgotten


def test_a_switch_that_does_not_answer_its_commit_holds_no_pass_and_is_read_back_once_it_answers():
    bench = Bench(C1, C2)
    retries = []
    bench.applier.on_retry = lambda: retries.append("retry")
    bench.apply({C1: SwitchState(owned(1)), C2: SwitchState(owned(1))})
    bench.sw[C2].stall()
    result = bench.apply({C1: SwitchState(owned(2)), C2: SwitchState(owned(2))})
    assert result.switches[C1].state == "ok" and bench.ours(C1) == set(owned(2))
    assert result.switches[C2].state.startswith("not answering: no reply to its bundle's commit since ")
    assert result.made_on == (DPIDS[C1],)           # the status write's barriers skip it
    assert set(bench.sw[C2].flows.values()) == set(owned(1)) and len(bench.sw[C2].held) == 1
    # later passes leave it alone (not read, sent nothing) and say it still does not answer
    result = bench.apply({C1: SwitchState(owned(3)), C2: SwitchState(owned(3))})
    assert result.switches[C1].state == "ok" and bench.ours(C1) == set(owned(3))
    assert result.switches[C2].state.startswith("not answering") and len(bench.sw[C2].held) == 1
    assert bench.applier.check(result.switches[C2]) is None and retries == []
    # it answers (its late reply is the held bundle's): a pass is asked for, which reads it back
    # whole, whatever the reply said, and brings it to the desired state of now
    bench.sw[C2].answer()         # it takes the make it held; the break was never sent
    assert retries == ["retry"] and set(bench.sw[C2].flows.values()) == set(owned(1) | owned(2))
    reads = bench.sw[C2].reads
    result = bench.apply({C1: SwitchState(owned(3)), C2: SwitchState(owned(3))}, changed=set())
    assert bench.sw[C2].reads == reads + 1 and not bench.applier.unanswered
    assert result.switches[C2].state == "ok" and bench.ours(C2) == set(owned(3))


def test_a_switch_whose_connection_closes_while_its_commit_is_unanswered_is_read_back_when_back():
    bench = Bench(C1, C2)
    bench.apply({C1: SwitchState(owned(1)), C2: SwitchState(owned(1))})
    bench.sw[C2].stall()
    bench.apply({C1: SwitchState(owned(2)), C2: SwitchState(owned(2))})
    bench.switches.disconnect(DPIDS[C2])
    held = bench.sw[C2].held
    held[0][-1].settle(None)      # as the OpenFlow app settles what a closed connection awaited
    result = bench.apply({C1: SwitchState(owned(2)), C2: SwitchState(owned(2))})
    assert result.switches[C2].state.startswith("lost")
    bench.sw[C2].held = None      # OVS drops a closed connection's open bundles
    bench.switches.add(DPIDS[C2])
    result = bench.apply({C1: SwitchState(owned(2)), C2: SwitchState(owned(2))})
    assert result.switches[C2].state == "ok" and bench.ours(C2) == set(owned(2))
    assert not bench.applier.unanswered


def metered(port: int) -> frozenset:
    """A meter of port `port` (the tenant app's id space, as its flows' cookie)."""
    return frozenset({MeterSpec(ck.group_id(ck.APP_TENANT, port), 1000, 100, "pktps",
                                ck.cookie(ck.APP_TENANT, ck.KIND_PORT, port))})


def _on_connect(bench):
    bench.applier.forget(DPIDS[C2])               # it reconnected (Reconciler.switch_changed): read back
    bench.sw[C2].stall()
    return bench.apply({C1: SwitchState(owned(2)), C2: SwitchState(owned(2))})


def _audit(bench):
    bench.sw[C2].stall()
    return bench.apply({C1: SwitchState(owned(2)), C2: SwitchState(owned(2))}, audit=True)


def _meter(bench):
    bench.sw[C2].stall(after=1)                   # answers the meter read, then falls silent
    return bench.apply({C1: SwitchState(owned(2)), C2: SwitchState(owned(2), meters=metered(2))})


def _check(bench):
    bench.sw[C2].stall()
    res = bench.applier.results[C2]
    assert bench.applier.check(res) == "check"    # a pass is asked for: its statuses say so
    return bench.apply({C1: SwitchState(owned(2)), C2: SwitchState(owned(2))})


def _barrier(bench):
    result = bench.apply({C1: SwitchState(owned(2)), C2: SwitchState(owned(2))})
    bench.sw[C2].stall()
    assert bench.applier.barriers([DPIDS[C1], DPIDS[C2]]) == {DPIDS[C2]}
    assert bench.sw[C1].barriers == 1
    return result


@pytest.mark.parametrize("silent, what", [
    (_on_connect, "a meter read"), (_audit, "a group read"), (_meter, "the barrier after a meter message"),
    (_check, "a flow count"), (_barrier, "a barrier")], ids=["on-connect", "audit", "meter", "check", "barrier"])
def test_a_switch_silent_to_any_request_holds_no_pass_and_is_read_back_once_it_answers(silent, what):
    """Whatever went unanswered, the same: the switch is not answering (named), the other switch
    gets its changes, later passes ask it nothing, and its late reply asks for a pass that reads it
    back whole."""
    bench = Bench(C1, C2)
    retries = []
    bench.applier.on_retry = lambda: retries.append("retry")
    bench.apply({C1: SwitchState(owned(1)), C2: SwitchState(owned(1))})
    result = silent(bench)
    assert result.switches[C1].state == "ok" and bench.ours(C1) == set(owned(2))
    c2 = bench.applier.results[C2]
    assert c2.state.startswith(f"not answering: no reply to {what} since "), c2.state
    held = len(bench.sw[C2].held)        # the reads a diff needs are asked together: up to three
    assert held and DPIDS[C2] not in bench.applier.known
    result = bench.apply({C1: SwitchState(owned(3)), C2: SwitchState(owned(3))})
    assert result.switches[C1].state == "ok" and bench.ours(C1) == set(owned(3))
    assert result.switches[C2].state == c2.state and len(bench.sw[C2].held) == held    # asked nothing
    assert result.made_on == (DPIDS[C1],)
    assert bench.applier.check(result.switches[C2]) is None and retries == []
    bench.sw[C2].answer()
    assert retries == ["retry"]
    reads = bench.sw[C2].reads
    result = bench.apply({C1: SwitchState(owned(3)), C2: SwitchState(owned(3))}, changed=set())
    assert bench.sw[C2].reads == reads + 1 and not bench.applier.unanswered
    assert result.switches[C2].state == "ok" and bench.ours(C2) == set(owned(3))


# Many switches of one tier (br-int)
MANY = [SwitchKey(BR_INT, f"n{i:02}") for i in range(40)]
DPIDS.update({key: 0x100 + i for i, key in enumerate(MANY)})
# How long a stalled switch's request waits before it is Unanswered (as REPLY_WAIT does): long
# enough that every request of a round is asked before the first wait ends, on a busy machine
WAIT = 1.0


def _reads(bench, silent):
    for key in silent:
        bench.sw[key].stall(wait=WAIT)
    return bench.apply({key: SwitchState(owned(2)) for key in bench.sw}, audit=True), "a group read"


def _counts(bench, silent):
    for key in silent:
        bench.sw[key].stall(wait=WAIT)
    triggers = bench.applier.checks([bench.applier.results[key] for key in bench.sw])
    assert triggers == [("check" if key in silent else None) for key in bench.sw]
    return bench.apply({key: SwitchState(owned(2)) for key in bench.sw}), "a flow count"


def _commits(bench, silent):
    for key in silent:
        bench.sw[key].stall(wait=WAIT)
    return bench.apply({key: SwitchState(owned(2)) for key in bench.sw}), "its bundle's commit"


def _barriers(bench, silent):
    result = bench.apply({key: SwitchState(owned(2)) for key in bench.sw})
    for key in silent:
        bench.sw[key].stall(wait=WAIT)
    assert bench.applier.barriers([DPIDS[key] for key in bench.sw]) == {DPIDS[key] for key in silent}
    return result, "a barrier"


@pytest.mark.parametrize("round_, silent", [(_reads, MANY), (_counts, MANY), (_barriers, MANY),
                                            (_commits, MANY[:SENDERS])],
                         ids=["reads", "counts", "barriers", "commits"])
def test_silent_switches_are_asked_together_and_awaited_under_one_wait(round_, silent):
    """Forty silent switches of one tier (as many as it has senders, for its changes) and a live
    one: every silent switch is asked before the wait for any ends (one by one, each would be asked
    once the last one's wait ended: a round would wait as long as forty), each is `not answering`,
    and the live switch gets its change."""
    bench = Bench(C1, *MANY)
    bench.apply({key: SwitchState(owned(1)) for key in bench.sw})
    result, what = round_(bench, silent)
    silences = bench.switches.silences
    asked = {dpid for event, dpid, _what in silences if event == "asked"}
    assert asked == {DPIDS[key] for key in silent}, silences
    first_unanswered = next(i for i, (event, _dpid, _what) in enumerate(silences) if event == "unanswered")
    assert {dpid for event, dpid, _ in silences[:first_unanswered]} == asked, silences
    assert result.switches[C1].state == "ok" and bench.ours(C1) == set(owned(2))
    for key in silent:
        state = bench.applier.results[key].state
        assert state.startswith(f"not answering: no reply to {what} since "), (key, state)


def test_switches_read_back_have_their_flows_read_a_bounded_number_at_a_time(monkeypatch):
    """A sync reads every switch back: their flows are asked READ_FLOWS_AT_ONCE (desired flows) at a
    time, not all at once (every reply would be held in memory together), and every switch is
    still read back and brought to its desired state."""
    import fathom.controller.apply as apply_module
    from fathom.controller.fakeswitch import FakeSwitch
    monkeypatch.setattr(apply_module, "READ_FLOWS_AT_ONCE", 7)      # two switches of three flows
    events = []
    ask_flows = FakeSwitch.ask_flows

    def counted(self):
        asked = ask_flows(self)
        events.append(+1)
        result = asked.result
        asked.result = lambda: (events.append(-1), result())[1]
        return asked
    monkeypatch.setattr(FakeSwitch, "ask_flows", counted)
    bench = Bench(*MANY)
    bench.apply({key: SwitchState(owned(1)) for key in MANY})
    events.clear()
    result = bench.apply({key: SwitchState(owned(2)) for key in MANY}, audit=True)
    outstanding = [sum(events[:i + 1]) for i in range(len(events))]
    assert events.count(+1) == len(MANY) and max(outstanding) == 2, events
    assert all(result.switches[key].state == "ok" and bench.ours(key) == set(owned(2)) for key in MANY)
