"""The addresses a transaction chooses are held by the session that chose them (fathom.store.ops,
_Reservations): another session skips them while that transaction is open, its end releases
them, and the release is listened for on that session only, not on SQLAlchemy's Session class."""
from __future__ import annotations

import ipaddress

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from fathom.store import db, ops


@pytest.fixture
def engine(tmp_path):
    engine = db.open_store(f"sqlite:///{tmp_path}/store.db")
    admin = ops.Caller()
    with Session(engine) as s, s.begin():
        network = ops.create_network(s, admin, ops.Settings(), name="blue", type="vxlan")
        ops.create_subnet(s, admin, network_id=network.id, cidr=ipaddress.IPv4Network("10.0.0.0/24"))
    yield engine
    engine.dispose()


def begin(session: Session) -> Session:
    """A transaction that only reads (choosing an address inserts nothing): no SQLite write lock, so
    two can be open at once."""
    session.begin()
    session.connection(execution_options=db.READ_ONLY)
    return session


def choose(session: Session) -> str:
    """The address a new port of the network would get in this session's transaction, searched from
    the subnet's first address (not from the hint past the last choice)."""
    ops._free_from.clear()
    network = session.get(ops.m.Network, 1)
    return str(ops._allocate_ip(session, network, ops.subnets_of(session, network.id)[0], "fixed_ips"))


def test_two_sessions_hold_their_own_addresses_and_a_rollback_frees_them(engine):
    a, b = Session(engine), Session(engine)
    try:
        begin(a)
        begin(b)
        assert choose(a) == "10.0.0.2"
        assert choose(b) == "10.0.0.3"      # a's choice is held while a's transaction is open
        assert a.info[ops.RESERVED] == [(1, "10.0.0.2")]
        assert b.info[ops.RESERVED] == [(1, "10.0.0.3")]
        a.rollback()
        assert ops.RESERVED not in a.info
        assert b.info[ops.RESERVED] == [(1, "10.0.0.3")]     # a's end leaves b's reservation alone
        with begin(Session(engine)) as c:
            assert choose(c) == "10.0.0.2"  # rolled back: free at once
        b.commit()                          # nothing inserted: once no read is older, free again
        assert ops.RESERVED not in b.info
        with begin(Session(engine)) as c:
            assert choose(c) == "10.0.0.2"
            assert choose(c) == "10.0.0.3"
        # a session is reused for the next transaction: its listeners are not added twice
        begin(a)
        choose(a)
        a.rollback()
        assert list(a.dispatch.after_transaction_end).count(ops._release) == 1
    finally:
        a.close()
        b.close()


def test_the_release_is_bound_to_the_sessions_that_reserved(engine):
    with begin(Session(engine)) as reserving:
        choose(reserving)
        assert event.contains(reserving, "after_transaction_end", ops._release)
    with begin(Session(engine)) as other:
        ops.subnets_of(other, 1)
        assert not event.contains(other, "after_transaction_end", ops._release)
    assert not event.contains(Session, "after_transaction_end", ops._release)
    assert not event.contains(Session, "after_commit", ops._release_committed)


def test_on_postgresql_an_address_is_held_by_its_transaction_and_each_request_skips_its_own(postgres):
    """PostgreSQL: the address chosen is held by the choosing transaction's advisory lock, so
    another transaction (another process's, or this one's) takes the next; the gateway and the
    addresses the request chose already are skipped; the end of the holder frees its address."""
    engine = db.open_store(postgres.new_database(migrated=True))
    admin = ops.Caller()
    try:
        with Session(engine) as s, s.begin():
            network = ops.create_network(s, admin, ops.Settings(), name="blue", type="vxlan")
            ops.create_subnet(s, admin, network_id=network.id, cidr=ipaddress.IPv4Network("10.0.0.0/24"))

        def pick(session: Session, taken=frozenset()) -> str:
            ops._free_from.clear()
            network = session.get(ops.m.Network, 1)
            return str(ops._allocate_ip(session, network, ops.subnets_of(session, 1)[0], "fixed_ips", set(taken)))

        a, b = Session(engine), Session(engine)
        try:
            a.begin()
            b.begin()
            assert pick(a) == "10.0.0.2"                        # 10.0.0.1: the gateway
            assert pick(b) == "10.0.0.3"                        # a holds .2
            assert pick(a, taken={"10.0.0.2"}) == "10.0.0.4"    # a's own .2 and b's .3 skipped
            a.rollback()
            assert pick(b, taken={"10.0.0.3"}) == "10.0.0.2"    # a's end freed it
        finally:
            a.close()
            b.close()
        with Session(engine) as s, s.begin():   # an allocated address is skipped, its lock not taken
            s.execute(ops.insert(ops.m.Port.__table__), {"name": "p", "network_id": 1, "mac_address": "02:fd:00:00:00:01",
                                                        "port_security": False, "project_id": "admin", "status": "pending"})
            s.execute(ops.insert(ops.m.IpAllocation.__table__), {"port_id": 1, "subnet_id": 1, "network_id": 1,
                                                                "ip_address": "10.0.0.2"})
        with Session(engine) as s, s.begin():
            assert pick(s) == "10.0.0.3"
            held = s.scalar(ops.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"))
            assert held == 1
    finally:
        engine.dispose()
