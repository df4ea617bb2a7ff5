"""SQLite writers of one process take turns on a lock of the process's own: every way a write
transaction ends gives the turn back, and a writer that cannot get it in time is told the store
is busy (503, retry) with nothing changed. The busy timeout is cut to 0.3 s here, so a turn that
is never given back fails the next write instead of hanging."""
import contextlib
import threading

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from fathom.store import db
from fathom.store.errors import Busy


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setattr(db, "SQLITE_BUSY_MS", 300)
    engine = db.make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    with engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    yield engine
    engine.dispose()


def write(engine, x: int) -> None:
    with Session(engine) as s, s.begin():
        s.execute(text("INSERT INTO t VALUES (:x)"), {"x": x})


def rows(engine) -> list[int]:
    with engine.connect() as c:
        return sorted(r[0] for r in c.exec_driver_sql("SELECT x FROM t"))


def test_concurrent_writers_all_get_their_turn(engine, monkeypatch):
    # each writer waits behind up to seven others: on a loaded machine that outlasts the fixture's
    # 0.3 s, and what is asserted here is that every write lands, not how soon
    monkeypatch.setattr(db, "SQLITE_BUSY_MS", 2_000)
    errors = []

    def writer(w: int) -> None:
        try:
            for i in range(25):
                write(engine, w * 100 + i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert rows(engine) == sorted(w * 100 + i for w in range(8) for i in range(25))


def test_every_end_of_a_write_gives_the_turn_back(engine):
    with pytest.raises(ValueError):                 # an error inside: rolled back
        with Session(engine) as s, s.begin():
            s.execute(text("INSERT INTO t VALUES (1)"))
            raise ValueError("no")
    write(engine, 2)
    s = Session(engine)                             # closed without commit or rollback
    s.execute(text("INSERT INTO t VALUES (3)"))
    s.close()
    write(engine, 4)
    with engine.connect() as c:                     # a Core connection, rolled back
        c.exec_driver_sql("INSERT INTO t VALUES (5)")
        c.rollback()
    write(engine, 6)
    with engine.connect() as c:                     # one connection, two transactions in turn
        with c.begin():
            c.exec_driver_sql("INSERT INTO t VALUES (7)")
        with c.begin():
            c.exec_driver_sql("INSERT INTO t VALUES (8)")
    assert rows(engine) == [2, 4, 6, 7, 8]


@contextlib.contextmanager
def a_write_held_open(engine):
    """Another thread's write transaction, open (one row inserted) until the block ends."""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with Session(engine) as s, s.begin():
            s.execute(text("INSERT INTO t VALUES (1)"))
            holding.set()
            done.wait(10)
    t = threading.Thread(target=hold)
    t.start()
    try:
        assert holding.wait(10)
        yield
    finally:
        done.set()
        t.join(10)


def test_a_writer_that_waits_too_long_is_told_the_store_is_busy(engine):
    with a_write_held_open(engine):
        with pytest.raises(Busy):
            write(engine, 2)
    write(engine, 3)
    assert rows(engine) == [1, 3]


def test_reads_do_not_wait_for_a_writer(engine):
    with a_write_held_open(engine):
        with Session(engine) as s, s.begin():
            s.connection(execution_options=db.READ_ONLY)
            assert s.execute(text("SELECT count(*) FROM t")).scalar() == 0
