"""Replicas and switch leases on a real PostgreSQL server (fathom.cluster): taking, renewing, expiry,
balance over live replicas, refusal of a replica that does not match, and a replica's clock that does
not matter. Rounds are run by hand where a test needs a paused replica (one that does not renew).
Short lease times keep every test to a second or two."""
from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from fathom.cluster import leases
from fathom.cluster.leases import ClusterError, Timing
from fathom.cluster.mastership import Mastership
from fathom.lab.ovs import wait_for
from fathom.store.db import open_store

FAST = Timing(renew=0.05, lease=0.4, guard=0.05)


@pytest.fixture(scope="module")
def database(postgres):
    engine = open_store(postgres.new_database(migrated=True))
    yield engine
    engine.dispose()


@pytest.fixture
def engine(database):
    with database.begin() as conn:
        conn.execute(text("TRUNCATE cluster_replicas, cluster_leases"))
    return database


def switches(n: int) -> list[str]:
    return [f"{i:016x}" for i in range(1, n + 1)]


def replica(engine, name: str, n: int = 0, **kw) -> Mastership:
    kw.setdefault("timing", FAST)
    return Mastership(engine, lambda: switches(n), replica_id=name, **kw)


def test_one_replica_takes_every_switch_and_renews_without_changing_epochs(engine):
    a = replica(engine, "a", 4).join()
    gained = []
    a.on_gain = lambda s, e: gained.append((s, e))
    a.run_round()
    assert a.held() == {s: 1 for s in switches(4)} and sorted(gained) == [(s, 1) for s in switches(4)]
    for _ in range(3):
        a.run_round()
    assert a.held() == {s: 1 for s in switches(4)} and len(gained) == 4     # renewed: same epoch, no new gain
    assert a.epoch(switches(4)[0]) == 1 and a.epoch("ffff") is None


def test_a_paused_holder_loses_its_switches_with_a_newer_epoch_and_its_clock_does_not_matter(engine, monkeypatch):
    a, b = replica(engine, "a", 2).join(), replica(engine, "b", 2).join()
    # a round that cannot finish within the lease time fails (on a starved machine too): round on
    # until the two hold one switch each
    wait_for(lambda: [r.run_round() for r in (a, b)] and len(a.held()) == 1 and len(b.held()) == 1, 10,
             "each replica holding one switch", interval=0)
    (mine,) = a.held()
    epoch = a.epoch(mine)
    lost = []
    a.on_loss = lost.append
    # a's wall clock jumps an hour ahead: nothing in the cluster reads it
    monkeypatch.setattr(time, "time", lambda: 4e9)
    a.run_round()
    assert a.epoch(mine) == epoch
    # a pauses (no rounds): before the lease ends in PostgreSQL, it already stopped acting on its own
    time.sleep(FAST.lease - FAST.guard)
    assert a.epoch(mine) is None
    b.run_round()                # b is at its share (a still counts as live until its heartbeat ages out)
    time.sleep(FAST.guard + 0.05)
    b.run_round()
    assert b.epoch(mine) == epoch + 1 and len(b.held()) == 2
    a.run_round()                # a wakes: the lease moved; it takes the other share back only if free
    assert lost == [mine] and a.epoch(mine) is None


def test_a_switch_never_has_two_holders_under_concurrent_rounds(engine):
    """Four replicas run rounds back to back on 40 switches for a second, joining together and
    moving leases to balance: every lease taken has an epoch of its own (no two replicas are ever
    given one switch under one epoch), and each switch's epochs grow at every change of holder."""
    reps = [replica(engine, f"r{i}", 40).join() for i in range(4)]
    gains, stop = [], threading.Event()      # list.append is atomic
    for r in reps:
        r.on_gain = lambda s, e, who=r.id: gains.append((s, e, who))

    def spin(r):
        while not stop.is_set():
            r.run_round()
    threads = [threading.Thread(target=spin, args=(r,)) for r in reps]
    for t in threads:
        t.start()
    time.sleep(1)
    stop.set()
    for t in threads:
        t.join()
    assert len({(s, e) for s, e, _ in gains}) == len(gains), "one switch under one epoch given twice"
    for s in switches(40):
        epochs = [e for x, e, _ in gains if x == s]
        assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs), (s, epochs)
    assert sorted(len(r.held()) for r in reps) == [10, 10, 10, 10]
    held = {s: (r.id, e) for r in reps for s, e in r.held().items()}
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT switch, holder, epoch FROM cluster_leases")).all()
    assert {s: (h, e) for s, h, e in rows} == held


def test_balance_over_live_replicas_when_one_joins_and_one_leaves(engine):
    """100 switches over 3 replicas: 34/33/33; one killed (no release): the other two take its share
    within the lease time and a few rounds, 50/50; a new one joins: 34/33/33 again. Nothing moves
    once balanced (no flapping)."""
    changes = []
    reps = []
    for name in ("a", "b", "c"):
        r = replica(engine, name, 100)
        r.on_gain = lambda s, e, name=name: changes.append(("gain", name, s))
        r.on_loss = lambda s, name=name: changes.append(("loss", name, s))
        reps.append(r.start())
    try:
        wait_for(lambda: sorted(len(r.held()) for r in reps) == [33, 33, 34], 10, "3 replicas balanced")
        time.sleep(5 * FAST.renew)
        settled = len(changes)
        time.sleep(10 * FAST.renew)
        assert len(changes) == settled, changes[settled:]          # balanced: nothing moves
        epochs = {s: e for r in reps for s, e in r.held().items()}
        assert len(epochs) == 100
        reps[2].stop(leave=False)       # killed: its leases stay until they expire
        killed = time.monotonic()
        wait_for(lambda: sorted(len(r.held()) for r in reps[:2]) == [50, 50], 10, "2 replicas balanced")
        took = time.monotonic() - killed
        assert took < FAST.lease + 20 * FAST.renew, took
        # the switches that moved have a newer epoch; the others kept theirs
        now = {s: e for r in reps[:2] for s, e in r.held().items()}
        moved = {s for s in now if now[s] != epochs[s]}
        assert len(moved) == 33 and all(now[s] == epochs[s] + 1 for s in moved)
        d = replica(engine, "d", 100).start()
        reps[2] = d
        wait_for(lambda: sorted(len(r.held()) for r in reps) == [33, 33, 34], 10, "a joining replica takes its share")
    finally:
        for r in reps:
            if r._thread is not None and not r._stopping.is_set():
                r.stop()


def test_a_replica_that_leaves_hands_its_switches_over_at_once(engine):
    a, b = replica(engine, "a", 6).join(), replica(engine, "b", 6).join()
    for r in (a, b, a):
        r.run_round()
    assert len(a.held()) == 3 and len(b.held()) == 3
    a.stop()                    # gives up its leases and its row
    b.run_round()               # no wait for expiry
    assert len(b.held()) == 6
    with engine.connect() as conn:
        assert conn.execute(text("SELECT id FROM cluster_replicas")).scalars().all() == ["b"]


def test_a_replica_with_another_schema_or_pki_is_refused(engine):
    replica(engine, "a", schema_version="0015_cluster", pki_fingerprint="aa" * 32).join()
    with pytest.raises(ClusterError, match=r"refused: live replica a .*schema 0015_cluster.*this one schema 00[0-9][0-9]_"):
        replica(engine, "b", schema_version="0016_next", pki_fingerprint="aa" * 32).join()
    with pytest.raises(ClusterError, match="one PKI"):
        replica(engine, "c", schema_version="0015_cluster", pki_fingerprint="bb" * 32).join()
    replica(engine, "d", schema_version="0015_cluster", pki_fingerprint="aa" * 32).join()   # a match joins
    time.sleep(FAST.lease)      # a and d are no longer live (no heartbeat): a new version may start
    replica(engine, "e", schema_version="0016_next", pki_fingerprint="bb" * 32).join()


def test_a_cluster_on_sqlite_is_refused_clearly(tmp_path):
    engine = open_store(f"sqlite:///{tmp_path / 'fathom.db'}")
    with pytest.raises(ClusterError, match="needs PostgreSQL.*sqlite"):
        Mastership(engine, lambda: [])


def test_status_reads_replicas_and_leases_by_the_database_clock(engine):
    a, b = replica(engine, "a", 3, address="198.18.0.1:8080").join(), replica(engine, "b", 3).join()
    for r in (a, b, a):
        r.run_round()
    with engine.connect() as conn:
        out = leases.status(conn, FAST)
    assert [(r["id"], r["live"], r["switches"]) for r in out["replicas"]] == [("a", True, 2), ("b", True, 1)]
    assert out["replicas"][0]["address"] == "198.18.0.1:8080"
    assert {x["holder"] for x in out["leases"]} == {"a", "b"} and all(x["epoch"] == 1 for x in out["leases"])
    assert all(0 < x["expires_in"] <= FAST.lease and x["renewed_age"] >= 0 for x in out["leases"])


def test_shares_differ_by_one_at_most():
    assert leases.shares(["b", "a", "c"], 100) == {"a": 34, "b": 33, "c": 33}
    assert leases.shares(["a"], 0) == {"a": 0} and leases.shares([], 5) == {}
    with pytest.raises(ValueError):
        Timing(renew=1.0, lease=1.0)


def _metric(name: str, **labels) -> float:
    from prometheus_client import REGISTRY
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_round_that_cannot_finish_fails_and_the_leases_end_at_the_deadline(engine):
    """PostgreSQL holding the round (a lock it waits for): the round fails at the statement timeout
    (the lease time), is counted, and the leases end at the holder's deadline with on_loss."""
    a = replica(engine, "a", 2).join()
    a.run_round()
    assert len(a.held()) == 2
    lost = []
    a.on_loss = lost.append
    held, failures = _metric("fathom_cluster_leases_held"), _metric("fathom_cluster_renewal_failures_total")
    changes = _metric("fathom_cluster_lease_changes_total", change="lost")
    with engine.connect() as blocker:
        blocker.execute(text("LOCK TABLE cluster_replicas IN ACCESS EXCLUSIVE MODE"))
        a.run_round()
        a._expire_if_due()      # what the loop does before each round
        blocker.rollback()
    assert a.failures == 1 and _metric("fathom_cluster_renewal_failures_total") == failures + 1
    assert a.held() == {} and sorted(lost) == switches(2)
    assert _metric("fathom_cluster_leases_held") == held - 2
    assert _metric("fathom_cluster_lease_changes_total", change="lost") == changes + 2


def test_a_round_at_rest_that_cannot_finish_fails_and_a_new_session_runs_it_again(engine, monkeypatch):
    """The round at rest (its statement on the connection's libpq handle) held by PostgreSQL fails at
    the statement timeout as a full one does, counted; the next rounds, on a new session, come to
    rest again there (its statement prepared anew)."""
    a = replica(engine, "a", 2).join()
    ran = []
    rest_row = leases._rest_row

    def spy(conn, q):
        ran.append(conn.connection.driver_connection)
        return rest_row(conn, q)
    monkeypatch.setattr(leases, "_rest_row", spy)
    while not ran:                # its first rounds take the leases, then find the cluster at rest
        a.run_round()
    assert len(a.held()) == 2 and len(ran) == 1
    with engine.connect() as blocker:
        blocker.execute(text("LOCK TABLE cluster_replicas IN ACCESS EXCLUSIVE MODE"))
        a.run_round()
        blocker.rollback()
    assert a.failures == 1 and len(ran) == 2 and a._conn is None
    for _ in range(5):
        a.run_round()
    assert a.failures == 1 and len(a.held()) == 2 and len(ran) > 2 and ran[-1] is not ran[0]
    a.stop()


def test_rounds_at_rest_in_the_callers_transactions_run_the_slim_statement_across_a_rollback(engine, monkeypatch):
    """leases.run_round in the caller's transaction (not the rounds' autocommit session): its rounds
    at rest run the slim statement too, a rollback of one of them in between (psycopg then
    deallocates what it prepared) included."""
    steady = Timing(renew=0.05, lease=5.0, guard=0.1)
    with engine.begin() as conn:
        leases.join(conn, "a", "", "x", "insecure", steady, "", "")
    view, written, ran = leases.LeaseView(), leases.Written(), []
    rest_row = leases._rest_row
    monkeypatch.setattr(leases, "_rest_row", lambda conn, q: (ran.append(q["me"]), rest_row(conn, q))[1])
    for i in range(8):
        with engine.begin() as conn:
            got = leases.run_round(conn, "a", steady, switches(4) if i == 0 else (), set(switches(4)),
                                   view=view, written=written)
            if i == 4:
                conn.rollback()
    assert got.held == {s: 1 for s in switches(4)} and got.same and len(ran) >= 4


def test_a_replica_leases_only_the_switches_it_reaches_and_gives_up_one_it_no_longer_reaches(engine):
    reach = {"a": switches(2)[:1], "b": switches(2)}
    a = Mastership(engine, lambda: reach["a"], replica_id="a", timing=FAST, reachable_only=True).join()
    b = Mastership(engine, lambda: reach["b"], replica_id="b", timing=FAST, reachable_only=True).join()
    for m in (a, b, a):
        m.run_round()
    assert set(a.held()) == {switches(2)[0]} and set(b.held()) == {switches(2)[1]}   # b may not take the other: a holds it
    assert a.taken == b.taken == set(switches(2))
    lost = []
    a.on_loss = lost.append
    reach["a"] = []              # a's connection to its switch went away: it gives the lease up
    a.run_round()
    assert a.held() == {} and lost == [switches(2)[0]]
    b.run_round()
    assert set(b.held()) == {switches(2)[1]}     # at its share: a, below its share, may take it first
    time.sleep(FAST.lease)
    b.run_round()
    assert set(b.held()) == set(switches(2)) and b.epoch(switches(2)[0]) == 2   # nobody did: the one that reaches it
    a.run_round()
    b.run_round()                # a is below its share, but does not reach b's switches: b gives none up
    assert set(b.held()) == set(switches(2)) and a.held() == {}


def test_a_replica_row_says_where_its_openflow_listens_and_its_feed_lag(engine):
    a = Mastership(engine, lambda: (), replica_id="a", timing=FAST, openflow=":6653", feed_lag=lambda: 0.0125).join()
    a.run_round()
    with engine.begin() as conn:
        (row,) = leases.status(conn, FAST)["replicas"]
    assert (row["openflow"], row["feed_lag"]) == (":6653", 0.0125) and a.peers == {"a": ":6653"}


class Consumer:
    """What ClusterMember tells the reconciler (a switch to resync), and the bootstrapper it configures."""

    def __init__(self):
        self.resynced, self.forgotten = [], []
        self.applier = self
        self.bootstrapper = type("Bootstrapper", (), {"controller_port": 6653})()
        self.statuses = type("StatusWriter", (), {"writers": None})()
        self.board = type("StatusBoard", (), {"written": None})()
        self.model = None

    def reported_elsewhere(self):
        pass

    def changed_elsewhere(self):
        pass

    def forget(self, dpid):
        self.forgotten.append(dpid)

    def switch_changed(self, dpid, _datapath=None):
        self.resynced.append(dpid)


class _Connections:
    """One replica's connections to the fake switches (each switch's role is per connection)."""

    def __init__(self, fakes, name):
        self.fakes, self.name = fakes, name

    def session(self, dpid):
        return self.fakes.switches[dpid].connect(self.name) if self.fakes.session(dpid) else None

    def connected(self):
        return self.fakes.connected()


def test_a_replica_writes_to_a_switch_only_once_it_granted_the_master_role_under_the_lease_epoch(engine):
    from fathom.controller.cluster import ClusterMember, switch_name
    from fathom.controller.fakeswitch import FakeSwitches
    fakes = FakeSwitches()
    switch = fakes.add(0xfa00000000000001)
    name = switch_name(switch.dpid)
    members = {}
    for r in ("a", "b"):
        conns = _Connections(fakes, r)
        m = Mastership(engine, lambda c=conns: [switch_name(d) for d in c.connected()], replica_id=r, timing=FAST,
                       reachable_only=True, openflow=f"198.18.0.1:{6653 if r == 'a' else 6654}").join()
        members[r] = (m, ClusterMember(m, conns, Consumer()))
    (a, ma), (b, mb) = members["a"], members["b"]
    a.run_round()
    wait_for(lambda: ma.masters(switch.dpid), 5, "a to be granted the master role")
    assert switch.roles["a"] == "master" and switch.generation == a.epoch(name) == 1
    assert ma.reconciler.resynced == [switch.dpid]                       # resynced whole once master
    assert not mb.masters(switch.dpid) and mb.elsewhere(switch.dpid) is False   # b has not run a round yet
    b.run_round()
    assert mb.elsewhere(switch.dpid) and not mb.sets_up(switch.dpid) and ma.sets_up(switch.dpid)
    assert ma.targets("198.18.0.10") == mb.targets("198.18.0.10") == ["tcp:198.18.0.1:6653", "tcp:198.18.0.1:6654"]
    # a stops renewing (paused); b takes the lease under a newer epoch, the switch demotes a
    time.sleep(FAST.lease + FAST.guard)
    assert not ma.masters(switch.dpid)                                   # a's own deadline passed
    b.run_round()
    wait_for(lambda: mb.masters(switch.dpid), 5, "b to be granted the master role")
    assert switch.roles == {"a": "slave", "b": "master"} and switch.generation == 2
    ma.reconciler.forgotten.clear()
    a.run_round()                          # a wakes: its loss is told, it asks to be slave, writes nothing
    wait_for(lambda: switch.dpid in ma.reconciler.forgotten, 5, "a to drop the switch")
    assert not ma.masters(switch.dpid) and switch.roles["b"] == "master"
    ma._roles.shutdown(wait=True)
    mb._roles.shutdown(wait=True)


def test_a_master_writes_its_nodes_controller_targets_again_when_a_replica_joins_or_leaves(engine):
    """Every switch must reach every live replica: a replica no switch reaches gets no lease, so a
    master that kept its nodes' old targets would leave a replica that joins without its share."""
    from types import SimpleNamespace
    STEADY = Timing(renew=1.0, lease=10.0, guard=0.5)   # no lease ends between these hand-run rounds

    from fathom.controller.cluster import ClusterMember, switch_name
    from fathom.model import datapath_id
    consumer = Consumer()
    consumer.model = SimpleNamespace(nodes=[SimpleNamespace(id=1, name="n1"), SimpleNamespace(id=2, name="n2")],
                                     fabric=None)
    consumer.rechecked = []
    consumer.recheck_setup = consumer.rechecked.append
    reach = [switch_name(datapath_id(1))]          # a reaches n1's br-int only; nobody holds n2's
    a = Mastership(engine, lambda: reach, replica_id="a", timing=STEADY, reachable_only=True,
                   openflow="198.18.0.1:6653").join()
    member = ClusterMember(a, SimpleNamespace(session=lambda dpid: None), consumer)
    a.run_round()                                  # its own listener appears: n1 (its lease) and n2 (nobody's)
    assert a.epoch(reach[0]) is not None and consumer.rechecked == ["n1", "n2"]
    consumer.rechecked.clear()
    a.run_round()
    assert consumer.rechecked == []                # nothing changed
    b = Mastership(engine, lambda: (), replica_id="b", timing=STEADY, reachable_only=True,
                   openflow="198.18.0.1:6654").join()
    b.run_round()
    a.run_round()                                  # b joined: the nodes a sets up get b's listener
    assert consumer.rechecked == ["n1", "n2"]
    assert member.targets("198.18.0.10") == ["tcp:198.18.0.1:6653", "tcp:198.18.0.1:6654"]
    consumer.rechecked.clear()
    b.stop()
    a.run_round()                                  # b left: written again without it
    assert consumer.rechecked == ["n1", "n2"] and member.targets("198.18.0.10") == ["tcp:198.18.0.1:6653"]
    member._roles.shutdown(wait=True)


def test_a_replica_of_another_schema_is_refused_before_it_migrates_the_store(engine):
    """A new version's replica checks the live replicas before migrating: with one on another schema
    it stops with a clear message and the store's schema stays as the live replicas need it."""
    replica(engine, "a", schema_version="0015_cluster").join()
    with pytest.raises(ClusterError, match=r"schema 0099_next\) refused before migrating the store: live "
                                           r"replica a .* runs schema 0015_cluster"):
        leases.check_schema(engine, "0099_next", FAST)
    leases.check_schema(engine, "0015_cluster", FAST)       # the same schema passes
    time.sleep(FAST.lease)      # a is no longer live: a new version may migrate
    leases.check_schema(engine, "0099_next", FAST)


def test_a_controller_replica_refuses_to_start_beside_a_replica_of_another_schema(engine, tmp_path):
    """`fathom controller --cluster` (its serve) beside a live replica of another schema version
    stops at once, naming it, before it migrates the store or listens."""
    from fathom.controller.server import serve
    with engine.begin() as conn:    # a live replica of another version (its heartbeat ahead: live throughout)
        conn.execute(text("INSERT INTO cluster_replicas (id, address, started, heartbeat, schema_version, "
                          "pki_fingerprint) VALUES ('old', 'http://a:8080', now(), now() + interval '1 hour', "
                          "'0014_older', 'insecure')"))
    url = engine.url.render_as_string(hide_password=False)
    with pytest.raises(ClusterError, match=r"refused before migrating the store: live replica old "
                                           r"\(http://a:8080\) runs schema 0014_older"):
        serve(url, "127.0.0.1", 0, "127.0.0.1", 0, 10, state_dir=str(tmp_path), cluster=True)


def test_a_replica_stopped_inside_its_round_does_not_keep_its_leases(engine):
    """A replica paused (SIGSTOP) in the middle of its round's transaction holds its lease rows
    locked: PostgreSQL ends that session after a lease time, and another replica takes them."""
    a, b = replica(engine, "a", 3).join(), replica(engine, "b", 3).join()
    a.run_round()
    b.run_round()
    with engine.connect() as conn:     # as PostgreSQL has it (a's own view may have passed its deadline already)
        held_by_a = set(conn.execute(text("SELECT switch FROM cluster_leases WHERE holder = 'a'")).scalars())
    assert held_by_a
    paused = engine.connect()
    leases.limit_session(paused, FAST)
    paused.begin()
    leases.run_round(paused, "a", FAST, switches(3))      # its round, left open: the rows stay locked
    wait_for(lambda: (b.run_round(), set(b.held()) >= held_by_a)[1], 10 * FAST.lease,
             "b to take the paused replica's leases")
    with pytest.raises(Exception, match="terminat"):      # the paused session was ended by the server
        paused.execute(text("SELECT 1"))
    paused.close()


def _epochs(engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT switch, epoch FROM cluster_leases")).all())


def test_a_third_replica_joining_two_moves_its_share_once(engine):
    """Two replicas hold 60 switches, 30 each; a third joins, runs its first round more than a lease
    time later (a controller starting up), and reaches the switches a few at a time (as they are
    given its listener): each of the two frees only its surplus, toward the joiner and only what it
    reaches, and the joiner takes what was freed. The epochs' sum grows by the joiner's share
    exactly, no switch moves twice, and nothing moves once the shares are fair."""
    calm = Timing(renew=0.05, lease=1.0, guard=0.1)   # no lease ends on a slow round of a busy machine
    reach = {"a": switches(60), "b": switches(60), "c": []}
    changes = []
    reps = {}
    for name in ("a", "b"):
        reps[name] = Mastership(engine, lambda name=name: reach[name], replica_id=name, timing=calm,
                                reachable_only=True)
    try:
        for r in reps.values():
            r.start()
        wait_for(lambda: sorted(len(r.held()) for r in reps.values()) == [30, 30], 10, "a and b balanced")
        before = _epochs(engine)
        held_before = {name: set(r.held()) for name, r in reps.items()}
        for name, r in reps.items():
            r.on_gain = lambda s, e, name=name: changes.append(("gain", name, s))
            r.on_loss = lambda s, name=name: changes.append(("loss", name, s))
        c = reps["c"] = Mastership(engine, lambda: reach["c"], replica_id="c", timing=calm, reachable_only=True)
        c.on_gain = lambda s, e: changes.append(("gain", "c", s))
        c.on_loss = lambda s: changes.append(("loss", "c", s))
        c.join()
        time.sleep(calm.lease + 3 * calm.renew)
        c.start(joined=True)
        for n in (15, 40, 60):         # its reach grows: switches connect to it as they are given its listener
            time.sleep(5 * calm.renew)
            reach["c"] = switches(60)[:n]
        wait_for(lambda: sorted(len(r.held()) for r in reps.values()) == [20, 20, 20], 10, "a, b and c balanced")
        time.sleep(10 * calm.renew)    # and nothing moves after
        after = _epochs(engine)
        moved = {s for s in after if after[s] != before[s]}
        assert sum(after.values()) - sum(before.values()) == 20 == len(moved)
        assert all(after[s] == before[s] + 1 for s in moved) and moved == set(c.held())
        assert sorted(changes) == sorted([("gain", "c", s) for s in moved]
                                         + [("loss", n, s) for n in ("a", "b") for s in moved & held_before[n]])
    finally:
        for r in reps.values():
            r.stop()


def test_a_joiner_whose_rounds_its_gains_delay_takes_its_share_without_losing_it(engine):
    """Two replicas hold 120 switches, 60 each; a third joins reaching all 120, they free its share
    (40), and every lease it gains holds its round thread 50 ms (a replica that just took switches
    resyncs them, and its rounds wait for the CPU). Had it taken the 40 at once, its next round
    would come after the lease time, the others would take them back as if it had died and hand
    them over again (120 changes or more). It takes a batch a round (leases.HANDOVER_BATCH) and renews each
    before the next: the shares are fair, and each of the 40 switches moved once (a late round
    would cost one batch at most)."""
    calm = Timing(renew=0.05, lease=1.0, guard=0.1)
    reps = {name: Mastership(engine, lambda: switches(120), replica_id=name, timing=calm, reachable_only=True)
            for name in ("a", "b")}
    try:
        for r in reps.values():
            r.start()
        wait_for(lambda: sorted(len(r.held()) for r in reps.values()) == [60, 60], 10, "a and b balanced")
        before = _epochs(engine)
        c = reps["c"] = Mastership(engine, lambda: switches(120), replica_id="c", timing=calm, reachable_only=True)
        c.join().run_round()           # what it reaches is known: a and b free its share
        wait_for(lambda: sorted(len(r.held()) for r in reps.values()) == [0, 40, 40], 5, "a and b freeing 40")
        c.on_gain = lambda s, e: time.sleep(0.05)
        c.start(joined=True)
        wait_for(lambda: sorted(len(r.held()) for r in reps.values()) == [40, 40, 40], 15, "a, b and c balanced")
        time.sleep(2 * calm.lease)     # past the lease time of its last gains: nothing moves after
        assert sorted(len(r.held()) for r in reps.values()) == [40, 40, 40]
        changes = sum(_epochs(engine).values()) - sum(before.values())
        assert 40 <= changes <= 40 + leases.HANDOVER_BATCH, changes
    finally:
        for r in reps.values():
            r.stop()


def test_a_joiner_takes_what_was_freed_for_it_a_batch_a_round_however_long_ago_it_was_freed(engine):
    """One replica holds 60 switches; a second joins reaching them all and the first frees its share
    (30). The joiner takes a batch a round (leases.HANDOVER_BATCH) even once the leases were freed
    more than a lease time before (its batches took that long): below its share, what it reaches
    is its own to take, not a switch nobody would master."""
    calm = Timing(renew=0.05, lease=1.0, guard=0.1)
    a = Mastership(engine, lambda: switches(60), replica_id="a", timing=calm, reachable_only=True).join()
    a.run_round()                  # alone: every switch at once (nobody to lose a lease to)
    assert len(a.held()) == 60
    c = Mastership(engine, lambda: switches(60), replica_id="c", timing=calm, reachable_only=True).join()
    c.run_round()                  # what it reaches is known: a frees its share
    a.run_round()
    assert len(a.held()) == 30 and c.held() == {}
    c.run_round()
    assert len(c.held()) == leases.HANDOVER_BATCH
    with engine.begin() as conn:   # the rest was freed more than a lease time ago
        conn.execute(text("UPDATE cluster_leases SET renewed = renewed - make_interval(secs => 2) "
                          "WHERE holder IS NULL"))
    c.run_round()
    assert len(c.held()) == 2 * leases.HANDOVER_BATCH
    for _ in range(3):
        a.run_round()
        c.run_round()
    assert len(a.held()) == len(c.held()) == 30


def test_a_round_at_rest_is_one_statement_and_changes_nothing(engine, monkeypatch):
    """Three balanced replicas: a round at rest is one statement (heartbeat, renewal and the view
    together, autocommit: no BEGIN or COMMIT either): no lease taken or freed, no epoch raised, and
    nothing told to the consumer."""
    from sqlalchemy import Engine, event
    steady = Timing(renew=0.05, lease=5.0, guard=0.1)   # hand-run rounds: no lease ends between them
    reps = [Mastership(engine, lambda: switches(100), replica_id=n, timing=steady, reachable_only=True,
                       openflow=f"198.18.0.1:{6653 + i}").join() for i, n in enumerate("abc")]
    for _ in range(6):      # freed leases (never held here) are taken HANDOVER_BATCH a round
        for r in reps:
            r.run_round()
    assert sorted(len(r.held()) for r in reps) == [33, 33, 34]
    told = []
    for r in reps:
        r.on_gain, r.on_loss = (lambda *a: told.append(a)), (lambda *a: told.append(a))
        r.on_peers = r.on_reports = lambda: told.append("peers or reports")
    before = _epochs(engine)
    statements = []

    def count(conn, cursor, statement, *_):
        statements.append(statement.split()[0])
    event.listen(Engine, "before_cursor_execute", count)     # the rounds' engines are their own
    import psycopg
    execute = psycopg.Cursor.execute

    sent = []

    def driver_execute(cursor, query, *args, **kw):          # the round's statement, on the driver's cursor
        statements.append(str(query).split()[0])
        sent.append({k: v for k, v in args[0].items() if k.startswith("new_")})
        return execute(cursor, query, *args, **kw)
    monkeypatch.setattr(psycopg.Cursor, "execute", driver_execute)
    rest_row = leases._rest_row

    def libpq_execute(conn, q):                              # or at rest, on its libpq handle
        statements.append(leases._REST.split()[0])
        sent.append({k: v for k, v in q.items() if k.startswith("new_")})
        return rest_row(conn, q)
    monkeypatch.setattr(leases, "_rest_row", libpq_execute)
    try:
        for _ in range(3):
            for r in reps:
                r.run_round()
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    assert statements == ["WITH"] * 9, statements
    # nothing changed: what each replica reaches, its agents and its switches' states are not sent again
    assert sent == [{"new_reaches": False, "new_agents": False, "new_states": False}] * 9, sent
    assert all(r._conn.connection.dbapi_connection.autocommit for r in reps)   # no BEGIN, no COMMIT
    assert _epochs(engine) == before and told == []
    with engine.connect() as conn:
        holders = dict(conn.execute(text("SELECT switch, holder FROM cluster_leases")).all())
    assert holders == {s: r.id for r in reps for s in r.held()}
    for r in reps:
        r.stop()


def test_a_round_at_rest_after_its_leases_ended_locally_tells_them_again(engine):
    """At rest, a round returns the last round's findings as they were (Round.same). A replica whose
    leases ended by its own deadline (a round late by more than lease time minus guard, its
    heartbeat still live in PostgreSQL) is told them again by its next round, under the same
    epochs."""
    steady = Timing(renew=0.05, lease=5.0, guard=0.1)
    reps = [Mastership(engine, lambda: switches(6), replica_id=n, timing=steady, reachable_only=True).join()
            for n in "ab"]
    for _ in range(4):
        for r in reps:
            r.run_round()
    a = reps[0]
    held = a.held()
    assert len(held) == 3
    a.run_round()
    assert a._view.last is not None and a._view.last.same     # at rest: the next round returns it
    told = []
    a.on_gain, a.on_loss = (lambda s, e: told.append(("gain", s, e))), (lambda s: told.append(("loss", s)))
    a._drop("lost")                  # what _expire_if_due does once its deadline passed
    assert a.held() == {} and a.epoch(min(held)) is None
    a.run_round()
    assert a.held() == held and sorted(told) == sorted([("loss", s) for s in held] + [("gain", s, e) for s, e in held.items()])
    told.clear()
    a.run_round()
    assert a.held() == held and told == []
    for r in reps:
        r.stop()


def test_a_late_holder_renews_what_nobody_took_under_the_same_epoch(engine):
    """A round later than the lease time: the holder stopped acting at its own deadline (told the
    loss); nobody took its leases meanwhile, so its next round renews them with their epoch."""
    a = replica(engine, "a", 2).join()
    told = []
    a.on_gain, a.on_loss = (lambda s, e: told.append(("gain", s, e))), (lambda s: told.append(("loss", s)))
    a.run_round()
    epochs = a.held()
    time.sleep(FAST.lease + FAST.guard)
    a._expire_if_due()            # what the loop does before each round
    a.run_round()
    assert a.held() == epochs == _epochs(engine) == {s: 1 for s in switches(2)}
    assert told == [("gain", s, 1) for s in switches(2)] + [("loss", s) for s in switches(2)] \
        + [("gain", s, 1) for s in switches(2)]


def test_a_heartbeat_stale_again_right_after_its_revival_fails_one_round_not_the_replica(engine):
    """A process starved or paused between its heartbeat's revival and its round's statement (more
    than a lease time): that round fails and is counted; the replica goes on with its rounds and
    renews what nobody took."""
    from sqlalchemy import event
    a = replica(engine, "a", 2).join()
    a.run_round()
    epochs = a.held()
    time.sleep(FAST.lease + FAST.guard)
    a._expire_if_due()
    starve = [True]

    def slow_after_revive(conn, cursor, statement, params, context, executemany):
        if starve[0] and statement.startswith("UPDATE cluster_replicas SET heartbeat = clock_timestamp() WHERE id"):
            starve[0] = False
            time.sleep(FAST.lease + FAST.guard)
    event.listen(a._rounds, "after_cursor_execute", slow_after_revive)
    try:
        failures = a.failures
        a.run_round()                  # revived, then stale again by its round's statement
        assert not starve[0] and a.failures == failures + 1 and a.held() == {}
    finally:
        event.remove(a._rounds, "after_cursor_execute", slow_after_revive)
    a.run_round()
    assert a.held() == epochs == _epochs(engine)


def test_a_replica_whose_rounds_stopped_stays_in_the_controller_targets_for_the_keep_time(engine):
    """A replica that stops counting as live (no round for a lease time) keeps its OpenFlow listener
    in the switches' controller targets (`listeners`) for Timing.keep, so a late round costs it no
    connection; one that leaves is dropped at once."""
    short = Timing(renew=0.05, lease=0.2, guard=0.05)       # keep: 2 s
    a = Mastership(engine, lambda: (), replica_id="a", timing=short, openflow="198.18.0.1:6653").join()
    b = Mastership(engine, lambda: (), replica_id="b", timing=short, openflow="198.18.0.1:6654").join()
    c = Mastership(engine, lambda: (), replica_id="c", timing=short, openflow="198.18.0.1:6655").join()
    for r in (b, c, a):
        r.run_round()
    assert set(a.listeners) == {"a", "b", "c"}
    calls = []
    a.on_peers = lambda: calls.append(sorted(a.listeners))
    c.stop()                          # left: its row is gone
    a.run_round()
    assert calls == [["a", "b"]]
    time.sleep(short.lease)           # b runs no round: not live, still a target
    a.run_round()
    assert set(a.peers) == {"a"} and set(a.listeners) == {"a", "b"} and calls == [["a", "b"]]
    time.sleep(short.keep - short.lease + 0.1)
    a.run_round()
    assert set(a.listeners) == {"a"} and calls == [["a", "b"], ["a"]]


def test_a_take_locks_the_stale_holders_row_so_its_late_heartbeat_renews_nothing_taken(engine):
    """A lease is valid while its holder's heartbeat is live, and a round renews it by writing that
    heartbeat alone. A replica taking a stale holder's leases locks the holder's row until it
    commits: the holder's late round waits for it, then finds its heartbeat stale, writes it again
    apart (reviving) and holds only what nobody took; the taken lease has a newer epoch."""
    timing = Timing(renew=0.05, lease=1.0, guard=0.1)    # a busy machine's round fits in its deadline
    a = replica(engine, "a", 2, timing=timing).join()
    a.run_round()
    assert _epochs(engine) == {s: 1 for s in switches(2)}
    b = replica(engine, "b", 2, timing=timing).join()
    time.sleep(timing.lease + 0.05)   # both heartbeats age out; b's take below comes first
    taker = b._rounds.connect()
    leases.limit_session(taker, timing)
    taker.begin()
    taker.execute(leases._REVIVE, {"me": "b"})
    took = taker.execute(leases._TAKE, {"me": "b", "lease": timing.lease, "candidates": switches(1),
                                        "n": 1}).all()
    assert took == [(switches(1)[0], 2)]          # a's row is now locked FOR SHARE, uncommitted
    done = threading.Event()
    late = threading.Thread(target=lambda: (a.run_round(), done.set()))
    late.start()
    time.sleep(0.1)
    assert not done.is_set()          # a's heartbeat waits for b's take
    taker.commit()
    taker.close()
    late.join(5)
    assert done.is_set() and a.held() == {switches(2)[1]: 1}
    assert _epochs(engine) == {switches(1)[0]: 2, switches(2)[1]: 1}
    b.run_round()
    assert b.held() == {switches(1)[0]: 2}


def test_a_round_at_rest_reads_no_lease_row_until_a_lease_changes(engine):
    """Every lease held by a live replica and none changed since the last round: the round's answer
    carries no lease list (the replica keeps its copy). A lease given up, or a new switch's row,
    makes the next round of every replica read them again."""
    steady = Timing(renew=0.05, lease=5.0, guard=0.1)
    reach = {"a": switches(4), "b": switches(4)}
    reps = [Mastership(engine, lambda n=n: reach[n], replica_id=n, timing=steady, reachable_only=True).join()
            for n in "ab"]
    for _ in range(3):
        for r in reps:
            r.run_round()
    assert sorted(len(r.held()) for r in reps) == [2, 2]
    copies = [r._view.rows for r in reps]
    assert all(c and r._view.stamp for c, r in zip(copies, reps))
    for r in reps:
        r.run_round()
    assert [r._view.rows for r in reps] == copies and all(r._view.rows is c for r, c in zip(reps, copies))
    reach["a"] = switches(5)           # a new switch: its row changes the stamp
    for r in reps:
        r.run_round()
    assert all(r._view.rows is not c for r, c in zip(reps, copies))
    assert sorted(s for s, *_ in reps[1]._view.rows) == switches(5)
    for r in reps:
        r.stop()


def test_no_holder_is_stale_within_a_lease_time_of_postgresqls_start(tmp_path):
    """Rounds commit without waiting for the WAL's flush, so a crash may lose a heartbeat its
    replica saw committed: no lease is taken from a stale holder until PostgreSQL has run a lease
    time, past every deadline a lost heartbeat could have given. Here PostgreSQL stops and starts
    again while the holder's heartbeat ages out: the other replica takes nothing while PostgreSQL
    has run less than a lease time, and the holder, back in time, keeps its leases under their
    epochs."""
    from fathom.bench.postgres import PostgresServer
    timing = Timing(renew=0.05, lease=2.0, guard=0.1)     # PostgreSQL's start fits in it, busy or not
    server = PostgresServer().start()
    try:
        store = open_store(server.new_database(migrated=True))
        a, b = replica(store, "a", 2, timing=timing).join(), replica(store, "b", 2, timing=timing).join()
        for r in (a, b, a):
            r.run_round()
        held = {r.id: r.held() for r in (a, b)}
        assert sorted(len(h) for h in held.values()) == [1, 1]
        server.halt()
        time.sleep(timing.lease + 0.05)
        server.resume()
        store.dispose()

        def uptime() -> float:
            with store.connect() as conn:
                return conn.execute(text("SELECT extract(epoch FROM clock_timestamp() - pg_postmaster_start_time())"
                                         "::float")).scalar()
        rounds = 0
        while uptime() < timing.lease - 0.3:
            b.run_round()           # a is stale, but PostgreSQL has not run a lease time yet
            rounds += 1
            assert set(b.held()) <= set(held["b"]), b.held()
        assert rounds > 1
        a.run_round()               # its connection was closed by the stop: this round fails
        a.run_round()               # a revives its heartbeat: its lease is its own again
        b.run_round()
        assert a.held() == held["a"] and b.held() == held["b"]
        for r in (a, b):
            r.stop()
        store.dispose()
    finally:
        server.stop()


def test_what_a_replica_reaches_is_sent_when_it_changed_and_again_on_a_new_connection(engine, monkeypatch):
    """A round sends what its replica reaches only when it changed since its connection's last round;
    otherwise the statement uses the row's value: a lease of a switch it does not reach is freed all
    the same. A new connection (after a failed round) sends it again, so a row that lost it has it
    back."""
    steady = Timing(renew=0.05, lease=5.0, guard=0.1)
    s1, s2 = switches(2)
    reach = [s1, s2]
    a = Mastership(engine, lambda: reach, replica_id="a", timing=steady, reachable_only=True).join()
    sent = []
    round_row = leases._round_row

    def spy(conn, q):
        sent.append(q["new_reaches"])
        return round_row(conn, q)
    monkeypatch.setattr(leases, "_round_row", spy)

    def row_reaches():
        with engine.connect() as conn:
            return conn.execute(text("SELECT reaches FROM cluster_replicas WHERE id = 'a'")).scalar()
    a.run_round()
    a.run_round()
    assert set(a.held()) == {s1, s2} and sent == [True, False] and row_reaches() == f"{s1},{s2}"
    reach = [s1]
    a.run_round()
    assert set(a.held()) == {s1} and sent[-1] is True and row_reaches() == s1
    with engine.begin() as conn:     # a lease of a switch it does not reach held all the same
        conn.execute(text("UPDATE cluster_leases SET holder = 'a' WHERE switch = :s"), {"s": s2})
    a.run_round()                    # not sent: the row's value frees it
    assert sent[-1] is False and set(a.held()) == {s1}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT holder FROM cluster_leases WHERE switch = :s"), {"s": s2}).scalar() is None
    with engine.begin() as conn:     # a row that lost it, and a new connection
        conn.execute(text("UPDATE cluster_replicas SET reaches = '' WHERE id = 'a'"))
    a.run_round()
    assert sent[-1] is False and row_reaches() == ""     # the same connection: not sent
    a._end_connection()
    a.run_round()
    assert sent[-1] is True and row_reaches() == s1 and set(a.held()) == {s1}
    a.stop()


def test_a_round_at_rest_is_the_slim_statement_and_sees_what_the_full_one_sees(engine, monkeypatch):
    """At rest (what a replica sends unchanged, every lease held by a live replica, no lease and no
    replica's row changed since its last round) a round runs the slim statement alone, and finds
    what the full one finds. A change in another replica's row (what it reaches, the agents it
    hears, what its switches say), a lease freed or a replica no longer live makes the round run
    the full statement, which reads it."""
    steady = Timing(renew=0.05, lease=5.0, guard=0.1)
    reach = {"a": switches(4), "b": switches(4)}
    heard = {"a": {}, "b": {"n1": 0.0}}
    reps = {n: Mastership(engine, lambda n=n: reach[n], replica_id=n, timing=steady, reachable_only=True,
                          agents=lambda n=n: heard[n], openflow=f"127.0.0.1:{6650 + i}").join()
            for i, n in enumerate("ab")}
    a, b = reps["a"], reps["b"]
    ran = []
    round_row = leases._round_row

    def spy(conn, q, statement=leases._ROUND):
        ran.append("rest" if statement is leases._REST else "full")
        return round_row(conn, q, statement)
    monkeypatch.setattr(leases, "_round_row", spy)

    def rounds(n: int = 1) -> list[str]:
        ran.clear()
        for _ in range(n):
            for r in (a, b):
                r.run_round()
        return list(ran)

    def settled() -> bool:
        """At rest again (both replicas' rounds slim) within a few rounds."""
        return any(rounds() == ["rest", "rest"] for _ in range(4))

    def seen(r: Mastership) -> tuple:
        return (r.held(), r.taken, r.peers, r.listeners, r.replicas, r.reports, r._agents_at,
                {n: round(t) for n, t in r._agents_heard.items()})
    rounds(4)
    assert sorted(len(r.held()) for r in (a, b)) == [2, 2]
    report = {min(b.held()): ["unreachable", []]}
    b.switch_states = report
    rounds(2)
    assert rounds(3) == ["rest"] * 6
    at_rest = seen(a)
    assert a.reports == report and a.agent_heard("n1") is not None
    a._view = leases.LeaseView()         # a full round from scratch finds the same
    assert rounds() == ["full", "rest"] and seen(a) == at_rest
    assert settled()

    heard["b"] = {"n1": 0.0, "n2": 0.0}      # b's row changes: a reads it in full
    assert rounds() == ["rest", "full"] and a.agent_heard("n2") is None
    assert rounds()[:2] == ["rest", "full"] and a.agent_heard("n2") is not None
    assert settled()
    freed = max(b.held())
    reach["b"] = [s for s in switches(4) if s != freed]   # b frees a lease: a's next round reads every
    assert rounds() == ["rest", "full"]                     # lease, and none is at rest while one has
    assert rounds(2) == ["rest"] + ["full"] * 4 and freed not in a.taken | b.taken     # no holder
    reach["b"] = switches(4)
    assert settled() and sorted(len(r.held()) for r in (a, b)) == [2, 2]
    b.stop(leave=False)                 # b stops: once its heartbeat aged out, a reads every lease
    with engine.begin() as conn:
        conn.execute(text("UPDATE cluster_replicas SET heartbeat = heartbeat - interval '6 s' WHERE id = 'b'"))
    ran.clear()
    a.run_round()
    assert ran == ["rest", "full"] and "b" not in a.peers and a.taken == set(a.held())
    a.stop()
