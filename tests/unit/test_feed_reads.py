"""A replica reads only what another process wrote (fathom.cluster.feed, fathom.store.changes), on a
real PostgreSQL: process A's API commits with the change feed's notifications, process B follows the
feed with the reader a pass uses (fathom.controller.storeread.StoreReads). A port created in A is
patched into B's ports part alone, its delete cascades, a transaction too big to tell is read whole,
a status write wakes nobody, a listener that connects again reads whole, and after random writes in
A, B's incrementally kept model equals a fresh whole read. What the feed told is read once (it
came once committed), not again with the next read as B's own writes are."""
from __future__ import annotations

import random
import re
import threading

import pytest
from sqlalchemy import bindparam, event, text, update
from sqlalchemy.orm import Session

from fathom.cluster import feed
from fathom.controller.storeread import StoreReads
from fathom.lab.ovs import wait_for
from fathom.store import models as m
from fathom.store.changes import ALL, TableChanges
from fathom.store.db import open_store, session_factory
from fathom.store.snapshot import PARTS
from fathom.store.status import write_statuses

from .test_api import Client
from .test_store_rows import World, read_whole


class Reader:
    """Process B: its engine, the passes' reader, and the feed it follows. `marked()` waits until
    every notification committed before it arrived (PostgreSQL delivers them in commit order)."""

    def __init__(self, url: str):
        self.engine = open_store(url)
        self.store = StoreReads(session_factory(self.engine))
        self._heard = TableChanges(self.engine)    # what each notification made B's trackers count
        self.notes: list[set] = []
        self._marks, self._lock = 0, threading.Lock()
        self.store.read(whole=True)
        # through an engine with options of its own over the same pool, as a replica's lease rounds
        # hold it (fathom.cluster.mastership): what it is told is counted by the trackers of its pool
        self.listener = feed.follow(self.engine.execution_options(feed=False), "b", self._received)
        wait_for(lambda: self.notes == [{ALL}], 10, "B's listener to connect (and read whole once)")
        self.store.read(whole=False)

    def _received(self, _written: set) -> None:
        written = self._heard.take()
        with self._lock:
            if written == {"marker"}:
                self._marks += 1
            else:
                self.notes.append(written)

    def marked(self, writer_engine) -> None:
        """Wait for every notification A committed so far."""
        before = self._marks
        with writer_engine.begin() as conn:
            conn.execute(text("SELECT pg_notify(:c, 'mark 0 [\"marker\"]')"), {"c": feed.CHANNEL})
        wait_for(lambda: self._marks > before, 10, "the notifications committed before the mark")

    def settle(self, writer_engine) -> None:
        """Every notification so far read, and again (a read reads the tables of the read before again)."""
        self.marked(writer_engine)
        self.store.read(whole=False)
        self.store.read(whole=False)

    def read(self):
        """The model, and the parts read whole for it (part -> 1)."""
        reads = dict(self.store.reader.reads)
        model = self.store.read(whole=False)
        return model, {p: n - reads.get(p, 0) for p, n in self.store.reader.reads.items() if n != reads.get(p, 0)}

    def close(self):
        self.listener.stop()
        self.engine.dispose()


@pytest.fixture
def ab(postgres):
    url = postgres.new_database()
    a = Client(url)
    feed.notify_commits(a.app.state.engine, "a")
    b = Reader(url)
    yield a, b
    b.close()
    a.app.state.engine.dispose()


def test_a_port_written_in_another_process_is_patched_alone_and_its_delete_cascades(ab):
    a, b = ab
    net = a.post("/networks", {"name": "n"})["id"]
    sub = a.post("/subnets", {"network_id": net, "cidr": "198.18.70.0/24"})["id"]
    group = a.post("/security-groups", {"name": "g"})["id"]
    b.settle(a.app.state.engine)
    patches = b.store.reader.patches.get("ports", 0)
    port = a.post("/ports", {"network_id": net, "name": "p", "fixed_ips": [{"subnet_id": sub}],
                             "security_groups": [group]})["id"]
    b.marked(a.app.state.engine)
    assert ("port", port) in b.notes[-1] and ("port", None) not in b.notes[-1], b.notes[-1]
    model, read = b.read()
    assert read == {}, read      # the port patched in; no part read again (it holds no gateway's address)
    assert b.store.reader.patches["ports"] == patches + 1
    assert model == read_whole(b.engine)[0]
    assert [p.id for p in model.ports] == [port] and model.ports[0].security_groups == (group,)
    a.delete(f"/ports/{port}")
    b.marked(a.app.state.engine)
    assert {("port", port), ("port_cascade", "ip_allocations")} <= b.notes[-1], b.notes[-1]
    model, read = b.read()
    assert "ports" not in read and model.ports == () and model == read_whole(b.engine)[0]
    # the next port: its rows alone; the delete's tables are not read again (the feed counted the
    # delete once committed: the read before had it)
    again = a.post("/ports", {"network_id": net, "name": "q", "fixed_ips": [{"subnet_id": sub}]})["id"]
    b.marked(a.app.state.engine)
    model, read = b.read()
    assert read == {}, read
    assert [p.id for p in model.ports] == [again] and model == read_whole(b.engine)[0]
    a.delete(f"/ports/{again}")
    a.delete(f"/security-groups/{group}")   # cascades to the memberships: read as tables
    b.marked(a.app.state.engine)
    model, read = b.read()
    assert "secgroups" in read and model == read_whole(b.engine)[0]


class Statements:
    """The statements B's reads run, each with how it ran: (its text, in a transaction, its
    isolation level); those SQLAlchemy runs and those run on the driver's cursor (the read of
    ports by id: fathom.store.snapshot's run_prepared)."""

    def __init__(self, engine, monkeypatch):
        from fathom.store import snapshot
        self.seen: list[tuple[str, bool, str | None]] = []
        event.listen(engine, "before_cursor_execute", self._executed)
        real = snapshot.run_prepared

        def on_driver(conn, statement, *args, **kwargs):
            self._executed(conn, None, statement, None, None, False)
            return real(conn, statement, *args, **kwargs)
        monkeypatch.setattr(snapshot, "run_prepared", on_driver)

    def _executed(self, conn, _cursor, statement, _params, _context, _many):
        dbapi, table = conn.connection.dbapi_connection, re.search(r"\bFROM\s+(\w+)", statement)
        level = dbapi.isolation_level
        self.seen.append((table[1] if table else statement, not dbapi.autocommit,
                          level.name if level is not None else None))

    def take(self) -> list:
        out, self.seen = self.seen, []
        return out


def test_a_port_created_and_deleted_between_two_reads_is_not_a_reason_to_read_the_ports_whole(ab):
    """Its address rows were never read: the delete's tokens name rows the part does not know,
    which the creation's tokens, read with them, account for."""
    a, b = ab
    net = a.post("/networks", {"name": "n"})["id"]
    sub = a.post("/subnets", {"network_id": net, "cidr": "198.18.71.0/24"})["id"]
    kept = a.post("/ports", {"network_id": net, "name": "k", "fixed_ips": [{"subnet_id": sub}]})["id"]
    b.settle(a.app.state.engine)
    port = a.post("/ports", {"network_id": net, "name": "p", "fixed_ips": [{"subnet_id": sub}]})["id"]
    a.delete(f"/ports/{port}")
    b.marked(a.app.state.engine)
    assert any(isinstance(w, tuple) and w[0] == "ip_allocation" for w in b.notes[-1]), b.notes[-1]
    model, read = b.read()
    assert "ports" not in read, read
    assert [p.id for p in model.ports] == [kept] and model == read_whole(b.engine)[0]


def test_a_port_written_elsewhere_is_one_select_and_a_read_of_several_sees_one_state(ab, monkeypatch):
    """Every replica reads each port another wrote: one SELECT of its rows, outside a transaction
    (one state by itself); a read of several statements is one REPEATABLE READ transaction. A
    port that holds a router gateway's address, patched by row, reads the gateways part again, in
    that transaction, and the model still equals a whole read."""
    a, b = ab
    from .test_api_external import MEMBER, cloud
    c = cloud(a)
    b.settle(a.app.state.engine)
    statements = Statements(b.engine, monkeypatch)
    port = a.post("/ports", {"network_id": c["net"]["id"], "name": "p", "project_id": "p1",
                             "fixed_ips": [{"subnet_id": c["sub"]["id"]}]})["id"]
    b.marked(a.app.state.engine)
    statements.take()                 # the whole reads of the checks before
    model, read = b.read()
    assert statements.take() == [("ports", False, None)]
    assert read == {} and model == read_whole(b.engine)[0]
    # a write of a network and a port: several parts, one state
    a.post("/networks", {"name": "more"}, headers=MEMBER)
    a.patch(f"/ports/{port}", {"name": "q"})
    b.marked(a.app.state.engine)
    statements.take()                 # the whole reads of the checks before
    model, read = b.read()
    seen = statements.take()
    assert set(read) == {"networks"} and model == read_whole(b.engine)[0]
    assert len(seen) == 2 and all(inside and level == "REPEATABLE_READ" for _, inside, level in seen), seen
    # the router gateway's address port, renamed by id past the API: patched, and the gateways re-read
    a.patch(f"/routers/{c['router']['id']}", {"external_gateway": {"network_id": c["ext"]["id"]}}, headers=MEMBER)
    b.settle(a.app.state.engine)
    address_port = b.store.reader.parts["gateways"]["gateways"][0].address_port_id
    statements.take()
    with Session(a.app.state.engine) as s, s.begin():
        s.execute(update(m.Port).where(m.Port.id == address_port).values(mac_address="02:fe:00:00:00:99"))
    b.marked(a.app.state.engine)
    patches = b.store.reader.patches["ports"]
    statements.take()                 # the whole reads of the checks before
    model, read = b.read()
    seen = statements.take()
    assert set(read) == {"gateways"} and b.store.reader.patches["ports"] == patches + 1
    assert model == read_whole(b.engine)[0] and model.router_gateways[0].mac_address == "02:fe:00:00:00:99"
    assert [t for t, _, _ in seen] == ["ports", "router_gateways"], seen
    assert all(inside and level == "REPEATABLE_READ" for _, inside, level in seen), seen


def test_a_transaction_too_big_to_tell_is_read_whole_and_a_status_write_wakes_nobody(ab):
    a, b = ab
    engine = a.app.state.engine
    net = a.post("/networks", {"name": "n"})["id"]
    port = a.post("/ports", {"network_id": net, "name": "p"})["id"]
    b.settle(engine)
    seen = len(b.notes)
    with Session(engine) as s, s.begin():        # statuses: not the model, each replica writes its own
        write_statuses(s, {("port", port): ("error", "elsewhere"), ("network", net): ("error", "x")}, {})
    b.marked(engine)
    assert len(b.notes) == seen
    # a thousand ports named by id in one transaction: over a notification's size, so "everything"
    ids = [{"pid": port}] + [{"pid": 10**6 + i} for i in range(1000)]
    assert feed.payload({("port", i["pid"]) for i in ids}) == '["*"]' != feed.payload({("port", port)})
    with Session(engine) as s, s.begin():
        s.connection().execute(update(m.Port).where(m.Port.id == bindparam("pid")).values(name="big"), ids)
    b.marked(engine)
    assert b.notes[-1] == {ALL}
    model, read = b.read()
    assert set(read) == set(PARTS) and b.store.written is not None and ALL in b.store.written
    assert model == read_whole(b.engine)[0] and model.ports[0].name == "big"


def test_a_listener_that_connects_again_reads_whole(ab):
    a, b = ab
    a.post("/networks", {"name": "n"})
    b.settle(a.app.state.engine)
    seen = len(b.notes)
    with a.app.state.engine.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = 'fathom feed b'"))
    wait_for(lambda: len(b.notes) > seen and b.listener.connected, 10, "B's listener to connect again")
    assert b.notes[-1] == {ALL}
    _, read = b.read()
    assert set(read) == set(PARTS)


@pytest.mark.parametrize("reads_every", [1, 3])
def test_after_random_writes_in_another_process_the_kept_model_equals_a_whole_read(ab, reads_every):
    """B reads after each write, or after every third (a port created and deleted in between: its
    address rows are none B read)."""
    a, b = ab
    status_only: set = set()        # statuses written in A alone: not B's to know (see fathom.cluster.feed)
    world = World(a, random.Random(23), lambda written: status_only.update(written))
    b.marked(a.app.state.engine)
    b.read()
    ops: dict[str, int] = {}
    for i in range(40 * reads_every):
        op = world.step()
        ops[op] = ops.get(op, 0) + 1
        if (i + 1) % reads_every:
            continue
        b.marked(a.app.state.engine)
        kept = b.store.read(whole=False)
        stored = b.store.stored
        whole, whole_stored = read_whole(b.engine)
        assert kept == whole, (i, op)
        differ = {k for k in set(stored) | set(whole_stored) if stored.get(k) != whole_stored.get(k)}
        assert differ <= status_only, (i, op, differ - status_only)
    reader = b.store.reader
    assert reader.patches["ports"] > reader.reads["ports"], (reader.patches, reader.reads, ops)


def test_the_agents_desired_state_follows_another_process_s_writes(postgres):
    """B's agents' long-polls (fathom.api.agents.DesiredCache, its own reader) see a router A moved
    onto a gateway node, from the notification alone."""
    from .test_agents_api import GW_AGENT, _cloud
    url = postgres.new_database()
    a, b = Client(url), Client(url)
    feed.notify_commits(a.app.state.engine, "a")
    listener = feed.follow(b.app.state.engine, "b", lambda _written: b.app.state.agent_hub.changed())
    try:
        router = _cloud(a)
        wait_for(lambda: b.get("/agents/gw/desired", headers=GW_AGENT)["objects"] == [], 10, "B's first read")
        a.patch(f"/routers/{router['id']}", {"mode": "network-node", "gateway_node": "gw"})
        wait_for(lambda: [o["kind"] for o in b.get("/agents/gw/desired", headers=GW_AGENT)["objects"]]
                 == ["router_namespace"], 10, "B's agents to see the router A moved")
    finally:
        listener.stop()
        for c in (a, b):
            c.app.state.engine.dispose()
