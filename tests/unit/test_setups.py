"""The nodes' OVSDB checks on their own (fathom.controller.setups): a bounded wait, a late answer
reported, a failure retried with a backoff (known to whoever takes the failure), a crash turned into
the node's error."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

from fathom.controller import setups as st


def node(name="c1", **facts):
    return SimpleNamespace(**{"id": 1, "name": name, "management_ip": "198.18.0.1", "tunnel_ip": "198.18.1.1",
                              "datapath_type": None, **facts})


def test_a_failing_node_is_checked_less_often_each_time_and_at_once_when_its_facts_change(monkeypatch):
    monkeypatch.setattr(st, "RETRY_FIRST", 0.2)
    monkeypatch.setattr(st, "RETRY_MAX", 0.4)
    answer = ["error", "OVSDB unreachable (test)", {}]
    runs = []
    setups = st.Setups(lambda n: runs.append(n.management_ip) or tuple(answer), lambda name: None)
    c1 = node()

    def check(n) -> int:
        setups.start(n)
        setups.take([n.name], 5)
        return len(runs)
    try:
        assert check(c1) == 1
        assert check(c1) == 1 and not setups.due("c1")           # failed: retry in 0.2 s
        time.sleep(0.22)
        assert check(c1) == 2                                    # failed again: retry in 0.4 s
        time.sleep(0.22)
        assert check(c1) == 2
        time.sleep(0.2)
        assert check(c1) == 3                                    # at most RETRY_MAX apart
        moved = SimpleNamespace(**{**vars(c1), "management_ip": "198.18.0.2"})
        assert check(moved) == 4                                   # its facts changed: at once
        answer[0] = "complete"
        time.sleep(0.42)
        assert check(moved) == 5 and setups.due("c1")              # back: no retry time left
    finally:
        setups.stop()


def test_a_failure_taken_is_not_due_again_however_late_the_checks_end_is_told(monkeypatch):
    """A future's waiters wake before its done callbacks run, and on a loaded machine those can run
    after the next pass: the failure's retry time is known once its result is taken all the same
    (held back here: every done callback waits 0.3 s)."""
    monkeypatch.setattr(st, "RETRY_FIRST", 60.0)
    invoke = Future._invoke_callbacks

    def late_callbacks(self):
        time.sleep(0.3)
        invoke(self)
    monkeypatch.setattr(Future, "_invoke_callbacks", late_callbacks)
    runs = []

    def unreachable(n):
        time.sleep(0.05)                        # ends after its callback is added (a real check does)
        runs.append(n.name)
        return "error", "OVSDB unreachable (test)", {}
    setups = st.Setups(unreachable, lambda name: None)
    try:
        setups.start(node())
        assert setups.take(["c1"], 5)["c1"][0] == "error"
        assert not setups.due("c1")
        setups.start(node())                    # the next pass: no second check
        assert runs == ["c1"] and setups.pending() == set()
    finally:
        setups.stop()


def test_take_waits_a_bounded_time_and_a_late_answer_is_reported():
    release, late = threading.Event(), []
    setups = st.Setups(lambda n: release.wait(5) and ("complete", "", {"tap1": 10}), late.append)
    try:
        setups.start(node())
        t = time.monotonic()
        assert setups.take(["c1"], 0.05) == {"c1": None}          # still running: not waited for longer
        assert time.monotonic() - t < 1 and setups.pending() == {"c1"}
        setups.start(node())                                       # one check of a node at a time
        release.set()
        deadline = time.monotonic() + 5
        while not late and time.monotonic() < deadline:
            time.sleep(0.01)
        assert late == ["c1"]                                      # its end wakes whoever takes it
        assert setups.take(["c1"], 0) == {"c1": ("complete", "", {"tap1": 10})}
        assert setups.pending() == set() and setups.due("c1")
    finally:
        setups.stop()


def test_a_check_that_raises_is_the_nodes_error_and_is_retried_later(monkeypatch):
    monkeypatch.setattr(st, "RETRY_FIRST", 60.0)

    def crash(_node):
        raise OSError("connection refused")
    setups = st.Setups(crash, lambda name: None)
    try:
        setups.start(node())
        state, reason, ports = setups.take(["c1"], 5)["c1"]
        assert (state, ports) == ("error", {}) and "connection refused" in reason
        assert not setups.due("c1")
        assert setups.due("c1", (2, "198.18.0.1", "198.18.1.1", None))   # other facts: at once
    finally:
        setups.stop()


def test_a_pass_answers_from_the_replica_unless_a_node_must_be_checked(monkeypatch):
    monkeypatch.setattr(st, "SETUP_WAIT", 0.05)
    release, runs = threading.Event(), []
    setups = st.Setups(lambda n: runs.append(n.name) or (release.wait(5) and ("complete", None, {"tap1": 3})),
                       lambda name: None)
    replica = {"c1": ("complete", None, {"tap1": 1}), "c2": None}
    try:
        nodes = [node("c1"), node("c2", id=2), node("c3", id=3)]
        trusted = lambda n: n.name != "c3"   # noqa: E731 - c3's bridges changed
        t = time.monotonic()
        answers, checked = setups.answers(nodes, trusted, lambda n: replica.get(n.name), impatient=set())
        assert answers == {"c1": replica["c1"], "c2": None, "c3": None}   # c2: no replica, c3: due
        assert checked == {"c2", "c3"} and sorted(runs) == ["c2", "c3"]
        assert time.monotonic() - t < 1                                    # waited SETUP_WAIT only
        release.set()
        time.sleep(0.1)
        replica["c2"] = ("complete", None, {"tap1": 2})
        answers, checked = setups.answers(nodes[:2], lambda n: True, lambda n: replica.get(n.name), impatient=set())
        # the checks still held are taken (c3's too, though no longer asked for), no new check runs
        checked_answer = ("complete", None, {"tap1": 3})
        assert answers == {"c1": replica["c1"], "c2": checked_answer, "c3": checked_answer}
        assert checked == {"c2"} and sorted(runs) == ["c2", "c3"]
        answers, checked = setups.answers(nodes[:2], lambda n: True, lambda n: replica.get(n.name), impatient=set())
        assert answers == {"c1": replica["c1"], "c2": replica["c2"]} and checked == set()
    finally:
        setups.stop()
