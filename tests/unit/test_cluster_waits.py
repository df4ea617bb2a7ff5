"""A long-poll held on a replica that does not write the status (two replicas, one real PostgreSQL,
fake switches, rounds and passes run by hand): it is answered by the writer's status as it
commits, with no pass of its own, once the writer's pass had read the caller's write; a status
the writer decided from a read that did not have the caller's write does not answer it, whatever
its value (fathom.controller.board, fathom.cluster.feed.Claim)."""
from __future__ import annotations

import contextlib
import threading
import time
import warnings

import pytest

from fathom import client as client_module
from fathom.api import create_app
from fathom.client import ApiError, Client
from fathom.cluster import feed
from fathom.cluster.mastership import Mastership
from fathom.controller.cluster import ClusterMember, switch_name
from fathom.controller.reconciler import Reconciler
from fathom.lab.ovs import wait_for
from fathom.model import datapath_id
from fathom.store.db import session_factory

from .auth import headers_for
from .test_cluster_statuses import TIMING, Connections, golden_cloud, share_switches
from .test_cluster_statuses import Replica as StatusesReplica
from .test_reconciler import FixedBootstrap

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


class Replica(StatusesReplica):
    """A replica as `fathom controller --cluster` wires one (fathom.controller.server, cluster.run):
    its API's writes wake its reconciler and notify the feed, its long-polls wait on its status
    board, its feed counts the others' writes; its passes are run by hand."""

    def __init__(self, name: str, url: str, fakes, ofports):
        self.app = app = create_app(url, on_change=lambda: self.rec.wake())
        engine = app.state.engine
        self.rec = Reconciler(session_factory(engine), Connections(fakes, name), FixedBootstrap(ofports),
                              check_incremental=True, startup_grace=0.0)
        app.state.status_board = self.rec.board
        self.mastership = Mastership(engine, lambda: [switch_name(d) for d in self.rec.switches.connected()],
                                     replica_id=name, timing=TIMING, reachable_only=True,
                                     agents=app.state.agent_hub.present).join()
        feed.notify_commits(engine, name)
        self.member = ClusterMember(self.mastership, self.rec.switches, self.rec)
        self.feed = self.member.feed = feed.follow(engine, name, self.rec.written_elsewhere, self.rec.board.heard)
        wait_for(lambda: self.feed.connected, 10, f"replica {name}'s change feed to connect")
        self.http = TestClient(app, headers=headers_for(app))


@contextlib.contextmanager
def writer_and_other(postgres):
    """Two replicas on one database and a bound port: (w, o, port), w the writer of the port's
    status (it masters the br-int of the port's node), o the other."""
    url = postgres.new_database(migrated=True)
    topo, ids, snap, nodes, fakes, ofports = golden_cloud(url)
    a, b = Replica("a", url, fakes, ofports), Replica("b", url, fakes, ofports)
    try:
        share_switches(a, b, fakes)
        vm, node = next((v.name, n.name) for n, v in topo.vms())
        w, o = (a, b) if a.member.masters(datapath_id(nodes[node])) else (b, a)
        yield w, o, ids["ports"][vm]
    finally:
        a.close()
        b.close()



def test_a_long_poll_through_another_replica_is_answered_by_the_writers_status_after_its_write(postgres):
    # w writes the status of a port on a node whose br-int it masters; o does not
    with writer_and_other(postgres) as (w, o, port):
        interface = o.http.get(f"/v1/ports/{port}").json()["interface_name"]
        assert o.http.get(f"/v1/ports/{port}").json()["status"] == "active"
        passes = o.rec.passes

        # through o: the port's interface renamed to one not plugged; o's long-poll for `down`
        # is answered when w's pass, which read that write, writes `down`: no pass of o's
        assert o.http.patch(f"/v1/ports/{port}", json={"interface_name": "nothere0"}).status_code == 200
        need = o.rec.board.requested
        xid = o.rec.board._writes[need]
        got: dict = {}
        poll = threading.Thread(target=lambda: got.update(o.http.get(
            f"/v1/ports/{port}", params={"wait": "down", "timeout": 30}).json()))
        poll.start()
        wait_for(lambda: o.rec.board._waiters, 5, "the long-poll to wait on o's board")
        wait_for(lambda: w.feed.claim().covers(xid), 5, "o's write to reach w through the change feed")
        woken = o.rec.board.woken
        w.rec.run_pass()
        poll.join(20)
        assert not poll.is_alive() and got["status"] == "down", got
        assert o.rec.board.woken == woken + 1 and o.rec.passes == passes

        # w's feed stops before o's next write: w's next status (`active` again, its own write
        # undone) is decided from a read that does not have it, and answers no long-poll on o
        # after that write, though o's board shows it; o's own pass, which read it, does
        w.feed.stop()
        w.feed._thread.join(5)
        assert w.http.patch(f"/v1/ports/{port}", json={"interface_name": interface}).status_code == 200
        assert o.http.patch(f"/v1/ports/{port}", json={"name": "renamed"}).status_code == 200
        need = o.rec.board.requested
        keys = (("port", port),)
        w.rec.run_pass()
        wait_for(lambda: o.rec.board.statuses.get(("port", port), ("",))[0] == "active", 5,
                 "w's `active` to reach o's board")
        assert o.rec.board.answer(keys, "active", need) is None
        assert o.rec.board.answer(keys, "active", need - 1) == ("active", None)   # o's write w had read
        o.rec.run_pass()
        assert o.rec.board.answer(keys, "active", need) == ("active", None)


def test_a_claim_names_only_the_own_writes_its_snapshot_does_not_show(postgres):
    """A pass's claim adds this replica's own API writes to what its change feed counted, for a
    write whose notification is not back yet; a write the feed's snapshot shows committed is not
    named again (the claim rides in every status notification, to every replica)."""
    with writer_and_other(postgres) as (w, _o, port):
        assert w.http.patch(f"/v1/ports/{port}", json={"name": "first"}).status_code == 200
        first = w.rec.board._writes[w.rec.board.requested]
        assert w.http.patch(f"/v1/ports/{port}", json={"name": "second"}).status_code == 200
        second = w.rec.board._writes[w.rec.board.requested]
        # the second write's notification carries its snapshot, taken after the first committed
        wait_for(lambda: feed.Claim("w", w.feed.claim().snapshot, frozenset()).covers(first)
                 and w.feed.claim().covers(second), 5, "both writes to count in w's feed")
        claim = w.member.claim()
        assert claim.covers(first) and claim.covers(second)
        assert first not in claim.xids and len(w.rec.board.own_writes(feed.CLAIM_XIDS)) >= 2


def test_a_long_poll_after_a_write_made_on_another_replica_waits_for_a_read_that_had_it(postgres, monkeypatch):
    """The client library writes through one replica and long-polls another, which has not counted
    that write: with the write's `X-Fathom-Commit` sent back, the long-poll is not answered by the
    status from before the write (fathom.api.commits); it is by the writer's status that read it."""
    with writer_and_other(postgres) as (w, o, port):
        apps = {"http://w/v1": w.app, "http://o/v1": o.app}
        monkeypatch.setattr(client_module.httpx, "Client", lambda base_url, headers, timeout: TestClient(
            apps[base_url], base_url=base_url, headers=headers))
        client = Client(["http://w", "http://o"], token=w.http.headers["Authorization"].split()[1])
        assert client.get(f"/ports/{port}")["status"] == "active" and client.commit is None   # reads commit nothing

        # through w: the port's interface renamed to one not plugged (it goes `down`)
        client.patch(f"/ports/{port}", json={"interface_name": "nothere0"})
        assert client.commit == w.rec.board._writes[w.rec.board.requested]
        # on o, `active` from before the write does not answer the long-poll: it is held until it
        # runs out, one request (answered at once, the client would ask again and again), and the
        # port is read as the write left it (`pending`)
        client.current = 1
        asked = []
        monkeypatch.setattr(client._clients[1], "request", lambda *args, request=client._clients[1].request,
                            **kwargs: asked.append(kwargs.get("headers")) or request(*args, **kwargs))
        started = time.monotonic()
        with pytest.raises(ApiError, match="status 'pending', not 'active' after 1 s"):
            client.wait_status("ports", port, "active", timeout=1.0)
        assert time.monotonic() - started >= 1.0
        assert asked == [{"X-Fathom-Commit": str(client.commit)}], asked
        # w's pass reads it and writes `down`: that answers the long-poll on o for `down`
        wait_for(lambda: w.feed.claim().covers(client.commit), 5, "w's own write to count in its claims")
        w.rec.run_pass()
        assert client.wait_status("ports", port, "down", timeout=10)["status"] == "down"
        assert client.current == 1
        # a header that is no transaction id is refused
        bad = o.http.get(f"/v1/ports/{port}", params={"wait": "down", "timeout": 1},
                         headers={"X-Fathom-Commit": "12x"})
        assert bad.status_code == 422 and "X-Fathom-Commit" in bad.text, bad.text
