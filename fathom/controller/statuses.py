"""Writing the statuses after a pass: decided from the pass's result (fathom.controller.status),
written to the store where they differ from it, then published on the status board (long-polls
wait on it: fathom.controller.board)."""
from __future__ import annotations

import logging
import time
from typing import Callable

from fathom.apps import BR_INT
from fathom.controller import status
from fathom.controller.board import StatusBoard
from fathom.controller.desired import IncrementalMismatch
from fathom.controller.results import PassResult
from fathom.model import Snapshot
from fathom.store.db import AT_ONCE

LOG = logging.getLogger("fathom.reconciler")   # one log for every part of the reconciler


class StatusWriter:
    """Decides, writes and publishes the statuses of each pass's objects and nodes.

    `session_factory`: the store's sessions; `store_reader` (fathom.store.snapshot.StoreReader) is
    told what was written; `barriers(dpids)`: a barrier's round trip to those switches (what an
    object's `active` waits for: see `write`), returning those that did not answer in time (not
    answering from then on); `on_decided()`: called once statuses were decided
    (DesiredState.statuses_decided). Until `grace_ends` (monotonic), while a switch has not
    connected or a node's OVSDB not been read, the statuses in the store stand (`held`)."""

    def __init__(self, session_factory, board: StatusBoard, store_reader, barriers: Callable,
                 on_decided: Callable[[], None], grace_ends: float, check_incremental: bool = False):
        self.Session = session_factory
        self.board = board
        self.store_reader = store_reader
        self.barriers = barriers
        self.on_decided = on_decided
        self.grace_ends = grace_ends
        self.check_incremental = check_incremental
        self.port_statuses = status.PortStatuses()    # kept by decide from pass to pass
        self.held = False                             # the last pass left the store's statuses alone
        self.mismatches = 0                           # check_incremental failures (must stay 0)
        # in a cluster (fathom.controller.cluster): writers(snapshot) -> whether this replica writes
        # a status key; None: every status is this process's to write
        self.writers: Callable | None = None
        # in a cluster: announce(statuses, claim) -> the notifications (channel, payload) that tell
        # the other replicas, in the transaction that writes them, the statuses this replica wrote
        # and which of their writes the pass had read (fathom.cluster.feed.status_notes)
        self.announce: Callable | None = None
        self._node_states: dict[str, str] = {}        # node name -> bootstrap state last written

    def write(self, snapshot: Snapshot, result: PassResult, stored: dict | None, seq: int, steps,
              heard_at: int | None = None, claim=None) -> None:
        """Write the statuses that differ from the store's, then publish them on the board as of
        API write `seq`. `stored`: the statuses as read with the model (an API write may have
        reset some), None when the store was not read (then: those last published). In a cluster
        a status another replica writes is published as the store holds it, or as the change feed
        brought it since `heard_at` (StatusBoard.take_heard), never as decided here; the statuses
        it writes are announced with `claim` (the other replicas' writes the pass read)."""
        if time.monotonic() < self.grace_ends and any(r.state == "not connected" or r.setup == "checking"
                                                      for r in result.switches.values()):
            self.held = True    # see STARTUP_GRACE; the periodic check ends it in time
            return
        self.held = False
        decided = status.decide(snapshot, result, self.port_statuses)
        self.on_decided()
        if self.check_incremental:
            self.assert_same_statuses(snapshot, result, decided)
        states = status.node_states(result)
        steps.done("decide")
        if stored is None:
            stored = dict(self.board.statuses)
            stored.update({("node_state", name): st for name, st in self._node_states.items()})
        write = {k: v for k, v in decided.items() if stored.get(k) != v}
        node_states = {k: v for k, v in states.items() if stored.get(("node_state", k)) != v}
        writes = self.writers(snapshot) if self.writers is not None else None
        published = decided
        if writes is not None and (write or node_states):
            theirs = {k: stored[k] for k in write if k in stored and not writes(k)}
            write = {k: v for k, v in write.items() if writes(k)}
            node_states = {k: v for k, v in node_states.items() if writes(("node_state", k))}
            if theirs:
                published = {**decided, **theirs}
        if result.settled_at is not None and any(v[0] == "active" and (stored.get(k) or ("",))[0] != "active"
                                                 for k, v in write.items()):
            # a switch acknowledges a bundle once its tables hold it, but its datapath forwards by
            # the flows it cached from the tables before (a VIF that sent before its flows came has
            # a cached drop) until OVS's revalidators have gone over them: an object turns `active`
            # once they have had the settle time after the make, so that `active` means it forwards
            time.sleep(max(0.0, result.settled_at - time.monotonic()))
            silent = set(self.barriers(result.made_on) or ()).intersection(result.made_on)
            steps.done("revalidate")
            if silent:   # fell silent since they took the make (Applier.barriers): decided again
                result.made_on = tuple(d for d in result.made_on if d not in silent)
                for res in result.switches.values():
                    if res.dpid in silent and res.key.bridge == BR_INT and res.key.name in result.nodes:
                        result.nodes[res.key.name].switch = res.state
                return self.write(snapshot, result, stored, seq, steps, heard_at, claim)
        if write or node_states:
            from fathom.store.status import at_once_writes, write_statuses
            notes = self.announce(write, claim) if write and self.announce is not None else ()
            with self.Session() as session, session.begin():
                if session.get_bind().dialect.name == "postgresql" and at_once_writes(write, node_states):
                    session.connection(execution_options=AT_ONCE)   # one statement: no BEGIN, COMMIT
                write_statuses(session, write, node_states, notes)
            self.store_reader.statuses_written({**write, **{("node_state", k): v for k, v in node_states.items()}})
        self._node_states = states
        steps.done("statuses")
        self.board.publish(published, seq, heard_at, writes, claim)
        steps.done("publish")

    def assert_same_statuses(self, snapshot: Snapshot, result: PassResult, decided: dict) -> None:
        """The statuses decided from those kept equal those decided whole (check_incremental);
        raises IncrementalMismatch naming what differs, and the next pass decides whole."""
        whole = status.decide(snapshot, result)
        if whole != decided:
            self.mismatches += 1
            self.port_statuses = status.PortStatuses()
            differ = sorted(str((k, decided.get(k), whole.get(k))) for k in set(whole) | set(decided)
                            if whole.get(k) != decided.get(k))
            LOG.error("statuses decided from those kept differ from a whole decision: %s", differ[:5])
            raise IncrementalMismatch(f"statuses decided from those kept differ: {differ[:5]}")
