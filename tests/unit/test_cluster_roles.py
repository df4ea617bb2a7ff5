"""A replica that holds a switch's lease gets the switch's master role under the lease's epoch, even
when its first role request did not end in a grant (fathom.controller.cluster.ClusterMember): the
request got no answer in time, the lease's local deadline passed while it ran (a late round on a
busy host), or a "not master" answer the switch sent before the grant was handled after it. Without
a grant it writes nothing to the switch, and nobody else may: the switch's flows would wait for the
lease to move. And a connection os-ken's request service no longer knows (role requests refused as
an invalid datapath, while the app has not heard it close) gives the lease up. Real PostgreSQL, the replica's rounds run by hand; the switch is the in-memory one
that keeps OpenFlow roles as OVS does."""
from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from fathom.cluster.leases import Timing
from fathom.cluster.mastership import Mastership
from fathom.controller.cluster import ClusterMember, switch_name
from fathom.controller.fakeswitch import FakeSwitches
from fathom.controller.switch import ApplyError
from fathom.store.db import open_store

from .test_cluster_leases import Consumer

FAST = Timing(renew=0.05, lease=0.4, guard=0.05)
DPID = 0xfa00000000000001


@pytest.fixture
def engine(postgres):
    engine = open_store(postgres.new_database(migrated=True))
    yield engine
    engine.dispose()


class _Connection:
    """The replica's connection to the switch; `before(epoch)` runs before each role request."""

    def __init__(self, conn, before):
        self.conn, self.before = conn, before

    def request_role(self, epoch):
        self.before(epoch)
        return self.conn.request_role(epoch)


class _Switches:
    def __init__(self, fakes: FakeSwitches, before):
        self.fakes, self.before = fakes, before

    def session(self, dpid):
        return _Connection(self.fakes.switches[dpid].connect("a"), self.before) if self.fakes.session(dpid) else None

    def connected(self):
        return self.fakes.connected()


def _replica(engine, before=lambda epoch: None):
    fakes = FakeSwitches()
    switch = fakes.add(DPID)
    switches = _Switches(fakes, before)
    mastership = Mastership(engine, lambda: [switch_name(d) for d in switches.connected()], replica_id="a",
                            timing=FAST, reachable_only=True, openflow="198.18.0.1:6653").join()
    return switch, mastership, ClusterMember(mastership, switches, Consumer())


def _idle(member: ClusterMember) -> None:
    """The replica's role requests asked so far have ended."""
    member._roles.submit(lambda: None).result(10)


def _granted_within(mastership: Mastership, member: ClusterMember, seconds: float) -> bool:
    """Rounds on time (every `renew`) for `seconds`: whether the switch made the replica its master."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        mastership.run_round()
        _idle(member)
        if member.masters(DPID):
            return True
        time.sleep(FAST.renew)
    return False


def test_a_role_request_unanswered_in_time_is_made_again(engine):
    unanswered = [1]

    def before(epoch):
        if epoch is not None and unanswered:
            unanswered.pop()
            raise ApplyError(f"switch {DPID:016x}: no reply to the role request within 2 s")
    switch, mastership, member = _replica(engine, before)
    try:
        mastership.run_round()
        _idle(member)
        assert mastership.epoch(switch_name(DPID)) == 1 and not member.masters(DPID)    # leased, not granted
        assert _granted_within(mastership, member, 5 * FAST.lease)
        assert switch.roles["a"] == "master" and switch.generation == 1 and member.reconciler.resynced == [DPID]
    finally:
        member._roles.shutdown(wait=True)


def test_a_grant_checked_after_the_leases_deadline_passed_is_asked_again_once_renewed(engine):
    slow = threading.Event()
    slow.set()

    def before(epoch):          # the round that renews the lease comes late, while this request runs
        if epoch is not None and slow.is_set():
            slow.clear()
            time.sleep(FAST.lease)
    switch, mastership, member = _replica(engine, before)
    try:
        mastership.run_round()
        _idle(member)
        assert switch.roles["a"] == "master" and not member.masters(DPID)   # the switch's master, unknowing
        assert _granted_within(mastership, member, 5 * FAST.lease)          # renewed under the same epoch
        assert mastership.epoch(switch_name(DPID)) == switch.generation == 1
    finally:
        member._roles.shutdown(wait=True)


def test_a_not_master_answer_handled_after_the_grant_does_not_leave_the_switch_without_a_master(engine):
    switch, mastership, member = _replica(engine)
    try:
        assert _granted_within(mastership, member, 5 * FAST.lease)
        member.not_master(DPID)      # a role status the switch sent before the grant, handled after it
        assert not member.masters(DPID)
        assert _granted_within(mastership, member, 5 * FAST.lease)
        assert switch.roles["a"] == "master" and member.reconciler.resynced == [DPID, DPID]
    finally:
        member._roles.shutdown(wait=True)


def test_a_connection_the_request_service_no_longer_knows_gives_the_lease_up_until_the_switch_connects_again(engine):
    from fathom.controller.switch import NotRegistered
    stale = threading.Event()
    stale.set()

    def before(epoch):          # os-ken's request service has dropped this connection; the app has not heard
        if stale.is_set():
            raise NotRegistered(result=DPID)
    switch, mastership, member = _replica(engine, before)
    mastership.switches = member.reaches
    name = switch_name(DPID)
    try:
        deadline = time.monotonic() + 5 * FAST.lease
        mastership.run_round()
        assert mastership.epoch(name) is not None
        while name in mastership.held() and time.monotonic() < deadline:   # asked again, refused again
            time.sleep(FAST.renew)
            mastership.run_round()
            _idle(member)
        assert name not in mastership.held() and member.reaches() == [] and not member.masters(DPID)
        stale.clear()
        member.connected(DPID)                 # the switch connects again
        assert _granted_within(mastership, member, 5 * FAST.lease)
        assert switch.roles["a"] == "master" and member.reaches() == [name]
    finally:
        member._roles.shutdown(wait=True)
