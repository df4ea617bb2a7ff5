"""The nodes' OVSDB bridge checks (Bootstrapper.run), run beside the reconciler's passes.

A pass starts the checks it needs (`Setups.start`) and waits for them a bounded time
(`Setups.take`, SETUP_WAIT): a node that answers later keeps the state the last pass left it in,
and its answer wakes another pass. A node whose check failed is checked again with a backoff
(RETRY_FIRST doubling up to RETRY_MAX), at once when its own facts change.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# Seconds a pass waits for the nodes' bridge checks it started (one OVSDB transaction each, run
# side by side): a node that answers later (unreachable, slow, many nodes at once) keeps the state
# the last pass left it in, and its check's end wakes another pass. One dead host must not hold up
# the changes of every other node for its connection timeout; a node already in error is checked
# again without any pass waiting for it (its answer comes with the pass it wakes).
SETUP_WAIT = 1.0
SETUP_WORKERS = 8
# A node whose check failed (its OVSDB unreachable or refusing) is checked again after RETRY_FIRST
# seconds, then twice as long after each further failure, at most RETRY_MAX: a host that is down
# costs a check every RETRY_MAX seconds, not a pass and a check as fast as they fail (100
# unreachable nodes kept a core busy), and one that comes back is found within RETRY_MAX and the
# periodic check's interval. A change of the node's own facts (management address, tunnel
# address, datapath type) checks it at once.
RETRY_FIRST = 0.5
RETRY_MAX = 5.0


class Setups:
    """Bootstrapper.run of nodes on a pool of threads: `start(node)` begins a node's check (unless
    one for the same node is still running or not yet taken, or the node failed and its retry is
    not due: RETRY_FIRST), `take(names, timeout)` waits for them at most `timeout` s and hands out
    the results that came (None: still running). A result that comes after its `take` gave up
    calls `late(name)`."""

    def __init__(self, run, late):
        self._run, self._late = run, late
        self._pool = ThreadPoolExecutor(SETUP_WORKERS, thread_name_prefix="node-setup")
        self._jobs: dict[str, tuple[tuple, object]] = {}   # node name -> (node's facts, future)
        self._waiting: set[str] = set()                     # names whose result comes after a take
        self._failed: dict[str, tuple[tuple, int, float]] = {}   # name -> (facts, failures in a row, retry at)
        self._lock = threading.Lock()

    def due(self, name: str, facts: tuple | None = None) -> bool:
        """Whether the node may be checked now: it has not failed, its retry time came, or its
        facts are not those it failed with."""
        failed = self._failed.get(name)
        return failed is None or (facts is not None and failed[0] != facts) or time.monotonic() >= failed[2]

    def pending(self) -> set[str]:
        """Nodes with a check running or a result not yet taken."""
        with self._lock:
            return set(self._jobs)

    def start(self, node) -> None:
        facts = (node.id, node.management_ip, node.tunnel_ip, node.datapath_type)
        with self._lock:
            job = self._jobs.get(node.name)
            if job is not None and (job[0] == facts or not job[1].done()):
                return
            if not self.due(node.name, facts):
                return
            future = self._pool.submit(self._check, node, facts)
            self._jobs[node.name] = (facts, future)
        future.add_done_callback(lambda _f, name=node.name: self._done(name))

    def _check(self, node, facts: tuple):
        """The node's check, its failure (and when it is due again) recorded before its result is:
        a pass that takes the result finds the node not due (a future's waiters are woken before
        its done callbacks run, which a loaded machine can hold back past the next pass)."""
        failed = True
        try:
            result = self._run(node)
            failed = result[0] == "error"
            return result
        finally:
            with self._lock:
                if failed:
                    _, times, _ = self._failed.get(node.name, (facts, 0, 0.0))
                    self._failed[node.name] = (facts, times + 1,
                                               time.monotonic() + min(RETRY_MAX, RETRY_FIRST * 2 ** min(times, 30)))
                else:
                    self._failed.pop(node.name, None)

    def _done(self, name: str) -> None:
        with self._lock:
            late = name in self._waiting
            self._waiting.discard(name)
        if late:
            self._late(name)

    def answers(self, nodes, trusted, current, impatient: set[str]) -> tuple[dict, set[str]]:
        """Each node's answer for a pass (None: its check still running), and the names checked:
        a node `trusted(node)` with no check running answers from the OVSDB replica
        (`current(node)`, None when it cannot); any other is checked (`start`), and the checks are
        waited for SETUP_WAIT at most, but for the `impatient` names (nodes already in error)."""
        checking, got, due = self.pending(), {}, set()
        for node in nodes:
            if node.name not in checking and trusted(node):
                replica = current(node)
                if replica is not None:
                    got[node.name] = replica
                    continue
            due.add(node.name)
            self.start(node)
            checking.add(node.name)
        if checking:
            got.update(self.take(checking, SETUP_WAIT, patient=checking - impatient))
        return got, due

    def take(self, names, timeout: float, patient=None) -> dict:
        """`patient`: the names whose checks are waited for (default: all of `names`)."""
        with self._lock:
            futures = [self._jobs[n][1] for n in (names if patient is None else patient) if n in self._jobs]
        if futures:
            concurrent.futures.wait(futures, timeout)
        out = {}
        with self._lock:
            for name in names:
                job = self._jobs.get(name)
                if job is None:
                    continue
                if job[1].done():
                    del self._jobs[name]
                    try:
                        out[name] = job[1].result()
                    except Exception as e:  # noqa: BLE001 - the node's state, checked again next pass
                        out[name] = ("error", f"bridge check failed: {e}", {})
                else:
                    self._waiting.add(name)
                    out[name] = None
        return out

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
