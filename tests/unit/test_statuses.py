"""Writing the statuses after a pass on its own (fathom.controller.statuses.StatusWriter), over a
real store (SQLite): what the status model decides is written where it differs from the store and
published on the board, nothing is written when nothing changed, the store's statuses stand during
the start-up grace while a switch has not connected, and an `active` waits for the datapaths to
settle (a barrier to the switches that made it)."""
from __future__ import annotations

import time

from sqlalchemy import event

from fathom.apps import BR_INT, SwitchKey, compile_all
from fathom.controller.board import StatusBoard
from fathom.controller.results import PassResult, SwitchResult
from fathom.controller.statuses import StatusWriter
from fathom.controller.storeread import StoreReads
from fathom.model import datapath_id
from fathom.store.db import session_factory

from .test_reconciler_status import Cloud


class Steps:
    def __init__(self):
        self.done_steps: list[str] = []

    def done(self, step: str) -> None:
        self.done_steps.append(step)


class Writer:
    """A StatusWriter on a store with two nodes and a port on each (tests/unit/test_reconciler_status)."""

    def __init__(self, tmp_path, grace: float = 0.0):
        self.cloud = Cloud(f"sqlite:///{tmp_path / 'fathom.db'}")
        self.store = StoreReads(session_factory(self.cloud.engine))
        self.barriers: list[tuple] = []
        self.decided = 0
        self.writer = StatusWriter(session_factory(self.cloud.engine), StatusBoard(), self.store.reader,
                                   self.barriers.append, self._decided, time.monotonic() + grace,
                                   check_incremental=True)
        self.updates = 0
        event.listen(self.cloud.engine, "before_cursor_execute", self._counted)

    def _decided(self) -> None:
        self.decided += 1

    def _counted(self, _conn, _cursor, statement, *_args) -> None:
        self.updates += statement.lstrip().upper().startswith("UPDATE")

    def write(self, settled_at: float | None = None, made_on: tuple = (1,), **switch: str) -> PassResult:
        snapshot = self.cloud.snapshot
        ids = {n.name: n.id for n in snapshot.nodes}
        self.result = PassResult(switches={SwitchKey(BR_INT, n): SwitchResult(SwitchKey(BR_INT, n),
                                                                             datapath_id(ids[n]), state=s)
                                           for n, s in switch.items()},
                                 desired=compile_all(snapshot), settled_at=settled_at, made_on=made_on)
        self.writer.write(snapshot, self.result, None, 0, Steps())
        return self.result

    def port(self, name: str) -> tuple[str, str | None]:
        port = next(p for p in self.cloud.http.get("/v1/ports").json() if p["name"] == name)
        return port["status"], port["status_reason"]


def test_statuses_are_written_where_they_changed_and_published(tmp_path):
    w = Writer(tmp_path)
    w.write(c1="ok", c2="not connected")
    assert w.decided == 1 and not w.writer.held
    assert w.port("vm1") == ("active", None) and w.port("vm2")[0] == "pending"
    vm2 = next(p["id"] for p in w.cloud.http.get("/v1/ports").json() if p["name"] == "vm2")
    assert w.writer.board.get(("port", vm2))[0] == "pending"
    updates = w.updates
    w.write(c1="ok", c2="not connected")
    assert w.updates == updates                               # nothing differs: nothing written
    w.write(c1="ok", c2="ok")
    assert w.updates > updates and w.port("vm2") == ("active", None)
    assert w.writer.board.get(("port", vm2))[0] == "active"


def test_the_store_statuses_stand_during_the_startup_grace(tmp_path):
    w = Writer(tmp_path, grace=60.0)
    w.write(c1="ok", c2="ok")
    before = w.port("vm2")
    w.write(c1="ok", c2="not connected")
    assert w.writer.held and w.decided == 1 and w.port("vm2") == before
    w.writer.grace_ends = time.monotonic()
    w.write(c1="ok", c2="not connected")
    assert not w.writer.held and w.decided == 2 and w.port("vm2")[0] == "pending"


def test_an_object_turns_active_after_the_datapaths_settled(tmp_path):
    w = Writer(tmp_path)
    w.write(c1="ok", c2="not connected")
    assert w.barriers == []                                   # nothing made: no wait
    started = time.monotonic()
    w.write(settled_at=started + 0.2, c1="ok", c2="ok")      # vm2 turns active
    assert time.monotonic() - started >= 0.2 and w.barriers == [(1,)]
    w.write(settled_at=time.monotonic() + 5, c1="ok", c2="ok")   # nothing turns active: no wait
    assert w.barriers == [(1,)]


def test_a_switch_silent_at_the_barrier_holds_its_objects_pending(tmp_path):
    """The barrier before an `active` goes unanswered (fathom.controller.apply.Applier.barriers
    marks the switch not answering): the statuses are decided again, its objects `pending`, the
    others' `active`, and the switches that answered are not asked again for it."""
    w = Writer(tmp_path)
    w.write(c1="ok", c2="not connected")
    asked = []

    def barriers(dpids):
        asked.append(tuple(dpids))
        c2 = w.result.switches[SwitchKey(BR_INT, "c2")]
        if c2.dpid in dpids:
            c2.state = "not answering: no reply to a barrier since 12:00:00"
            return {c2.dpid}
        return set()
    w.writer.barriers = barriers
    c1, c2 = (datapath_id(n.id) for n in sorted(w.cloud.snapshot.nodes, key=lambda n: n.name))
    w.write(settled_at=time.monotonic(), made_on=(c1, c2), c1="ok", c2="ok")
    assert w.port("vm2") == ("pending", "node c2: br-int not answering: no reply to a barrier since 12:00:00")
    assert w.port("vm1") == ("active", None)
    assert asked == [(c1, c2)]      # vm1 on c1 was already active: no second barrier
