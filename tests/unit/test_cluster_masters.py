"""Two controller replicas on one real PostgreSQL store, their writes and statuses on the real change
feed, over fake switches (fathom.controller.fakeswitch) each replica reaches under a role of its own:
a replica works for the switches it masters only, and takes a switch over whole when it gains it.

- A node's interfaces changing wakes the master of its switches, not the other replica (which takes
  them with its next pass, and counts no drift meanwhile).
- A port made through the replica that does not master its node: that replica sends nothing to the
  node's switch nor checks the node's bridges again (it reads its OVSDB replica), and its long-poll does not answer `active` from its own view; it answers as the
  master's status write commits (the change feed), and the master's pass put the port's flows there.
- The periodic check reads the OVSDB replicas of the nodes a replica masters only; drift on a node
  is found by its master.
- The master leaves: the other replica gains its switches (a newer epoch, the master role on the
  switch), checks the node's bridges again, resyncs them with what it took meanwhile without waking (the interface plugged), and a
  port made then gets its flows and its `active` from it.
Rounds and passes are run by hand, so each step is deterministic."""
from __future__ import annotations

import threading
import time
from collections import Counter

from fathom.api import create_app
from fathom.cluster import feed
from fathom.controller.cluster import switch_name
from fathom.lab.ovs import wait_for
from fathom.model import datapath_id
from fathom.pipeline import cookies as ck

from .test_cluster_statuses import Replica, golden_cloud, share_switches


class Written:
    """A replica's connection to a switch that counts what the replica sent it (flow and group mods)."""

    def __init__(self, conn, dpid: int, sent: Counter):
        self._conn, self._dpid, self._sent = conn, dpid, sent

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def bundle(self, pairs):
        self._sent[self._dpid] += 1
        return self._conn.bundle(pairs)

    def plain(self, pairs):
        if pairs:
            self._sent[self._dpid] += 1
        return self._conn.plain(pairs)


class FedReplica(Replica):
    """A replica as `fathom controller --cluster` runs one: its API's writes wake its reconciler
    and notify the change feed, it follows the other's writes and statuses on the feed, and its
    long-polls wait on its status board; it counts what it sends each switch."""

    def __init__(self, name, url, fakes, ofports):
        app = create_app(url, on_change=lambda: self.rec.wake())
        feed.notify_commits(app.state.engine, name)
        super().__init__(name, app, fakes, ofports)
        app.state.status_board = self.rec.board
        self.feed.stop()    # the statuses-only listener of Replica: this one follows both channels
        self.feed = feed.follow(app.state.engine, name, self.rec.written_elsewhere, self.rec.board.heard)
        wait_for(lambda: self.feed.connected, 10, f"replica {name}'s change feed to connect")
        self.sent: Counter = Counter()
        session = self.conns.session
        self.conns.session = lambda dpid: (None if (c := session(dpid)) is None else Written(c, dpid, self.sent))

    def wait(self, port_id: int, want: str = "active") -> tuple[str, str | None]:
        got = self.http.get(f"/v1/ports/{port_id}", params={"wait": want, "timeout": 5}).json()
        return got["status"], got["status_reason"]


def flows_of(switch, port_id: int) -> int:
    return sum(ck.parse_cookie(f.cookie)[1:] == (ck.KIND_PORT, port_id) for f in switch.flows.values())


def test_a_replica_works_for_the_switches_it_masters_and_takes_one_over_when_it_gains_it(postgres):
    url = postgres.new_database(migrated=True)
    topo, _ids, snap, nodes, fakes, ofports = golden_cloud(url)   # both replicas' OVSDB replicas: one dict
    a, b = (FedReplica(name, url, fakes, ofports) for name in ("a", "b"))
    try:
        share_switches(a, b, fakes)
        # b: the master of a node with VMs (the names swapped if it is a's)
        node = next(n.name for n, _ in topo.vms() if b.member.masters(datapath_id(nodes[n.name])))
        dpid = datapath_id(nodes[node])
        if not b.member.masters(dpid):
            a, b = b, a
        switch = fakes.switches[dpid]
        network = next(n for n in snap.networks if any(p.node == node and p.network_id == n.id for p in snap.ports))
        a.sent.clear()
        b.sent.clear()

        # a VIF plugged on the node: its master wakes, the other replica does not (and sees no drift)
        ofports[node]["vif-x"] = max(ofports[node].values()) + 1
        for r in (a, b):
            r.rec._wake.clear()
            r.rec.ovsdb_changed(node, "ports")
        assert b.rec._wake.is_set() and not a.rec._wake.is_set()
        assert not a.rec.check() and not a.rec.drift
        b.rec.run_pass()

        # its port, made through a: a sends nothing to b's switch, and its long-poll answers `active`
        # only once b's status write comes through the feed (b's pass put the port's flows there);
        # a's pass reads b's node from its OVSDB replica, it does not check the node's bridges again
        checks = a.rec.bootstrapper.runs.get(node, 0)
        port = a.http.post("/v1/ports", json={"network_id": network.id, "name": "x", "node": node,
                                              "interface_name": "vif-x"}).json()["id"]
        a.rec.run_pass(audit=False)
        assert a.rec.bootstrapper.runs.get(node, 0) == checks
        assert a.rec.board.statuses[("port", port)][0] == "pending", a.rec.board.statuses[("port", port)]
        assert a.sent[dpid] == 0 and flows_of(switch, port) == 0
        answer: list = []
        poll = threading.Thread(target=lambda: answer.append(a.wait(port)))    # a long-poll held on a
        poll.start()
        wait_for(lambda: b.rec._wake.is_set(), 5, "a's write to reach b through the change feed")
        passes = a.rec.passes
        b.rec.run_pass()
        assert flows_of(switch, port) > 0 and b.sent[dpid] > 0
        poll.join(10)
        assert answer == [("active", None)] and a.rec.passes == passes   # answered with no pass of a's
        assert a.sent[dpid] == 0

        # b leaves: a gains its switches under a newer epoch and resyncs them
        epoch = b.mastership.epoch(switch_name(dpid))
        b.mastership.stop()
        for _ in range(3):
            a.mastership.run_round()
        checks = a.rec.bootstrapper.runs.get(node, 0)
        wait_for(lambda: a.member.masters(dpid), 5, "a to master b's switch once the switch granted it")
        assert a.mastership.epoch(switch_name(dpid)) > epoch and switch.generation == a.mastership.epoch(switch_name(dpid))
        assert switch.roles.get("a") == "master"
        ofports[node]["vif-y"] = max(ofports[node].values()) + 1     # plugged as b left: a woken by it now
        a.rec.ovsdb_changed(node, "ports")
        a.rec.run_pass(audit=False)
        assert a.sent[dpid] > 0 and flows_of(switch, port) > 0
        assert a.rec.bootstrapper.runs.get(node, 0) > checks     # the node gained: checked again whole
        second = a.http.post("/v1/ports", json={"network_id": network.id, "name": "y", "node": node,
                                                "interface_name": "vif-y"}).json()["id"]
        a.rec.run_pass()
        assert flows_of(switch, second) > 0
        assert a.wait(second) == ("active", None) and a.status(port) == ("active", None)
        assert switch.flows == {k: f for k, f in switch.flows.items()}   # nothing refused, nothing left half-made
        assert a.rec.mismatches == 0 and b.rec.mismatches == 0
    finally:
        a.close()
        b.close()


def test_a_replica_checks_the_ovsdb_of_the_nodes_it_masters_only(postgres):
    """The periodic check at rest: each replica compares with the port numbers it compiled with only
    the OVSDB replicas of the nodes whose br-int it masters (together: every node, once), and drift
    on a node is found by its master; the other replica does not look at it."""
    url = postgres.new_database(migrated=True)
    _topo, _ids, _snap, nodes, fakes, ofports = golden_cloud(url)
    a, b = (FedReplica(name, url, fakes, ofports) for name in ("a", "b"))
    try:
        share_switches(a, b, fakes)
        read: dict[str, list[str]] = {"a": [], "b": []}
        for name, r in (("a", a), ("b", b)):
            current = r.rec.bootstrapper.current
            r.rec.bootstrapper.current = lambda node, name=name, current=current: (read[name].append(node.name),
                                                                                   current(node))[1]
        assert not a.rec.check() and not b.rec.check()
        for name, r in (("a", a), ("b", b)):
            assert sorted(read[name]) == sorted(n for n, i in nodes.items() if r.member.masters(datapath_id(i)))
        assert sorted(read["a"] + read["b"]) == sorted(nodes) and read["a"] and read["b"]

        node = read["b"][0]          # an interface renumbered on b's node, its notification lost
        ofports[node][next(iter(ofports[node]))] += 1000
        assert not a.rec.check() and not a.rec.drift
        assert b.rec.check() and b.rec.drift == {"ovsdb": 1}
    finally:
        a.close()
        b.close()


def test_a_replica_defers_a_port_write_that_cannot_change_its_switches_and_reads_it_within_defer(
        postgres, monkeypatch):
    """A port made through b on a node b masters, in a network no other node holds (no rule names a
    remote group): its notification names where the port is; b's pass runs at once, a's is
    deferred and runs within DEFER, reading it, sending a's switches nothing. A port of that
    network on a's node wakes a at once, its master, with no reach to work out. A reach that leaves a's node out (the apps' answer made
    wrong) is counted by check_incremental: the deferred pass changed a switch a masters."""
    import fathom.controller.cluster as cluster
    from fathom.store.changes import port_at
    url = postgres.new_database(migrated=True)
    _topo, _ids, _snap, nodes, fakes, ofports = golden_cloud(url)
    a, b = (FedReplica(name, url, fakes, ofports) for name in ("a", "b"))
    heard: list[set] = []
    listener = feed.Listener(feed.libpq_conninfo(a.app.state.engine), "listener", heard.append).start()
    try:
        share_switches(a, b, fakes)
        green = a.http.post("/v1/networks", json={"name": "green", "segmentation_id": 1002}).json()["id"]
        a.http.post("/v1/subnets", json={"network_id": green, "cidr": "198.19.2.0/24"}).raise_for_status()
        # an unbound port: its project's default group made (a write of groups, which wakes every replica)
        a.http.post("/v1/ports", json={"network_id": green, "name": "first"}).raise_for_status()
        for rule in a.http.get("/v1/security-group-rules").json():
            if rule["remote_group_id"] is not None:
                assert a.http.delete(f"/v1/security-group-rules/{rule['id']}").status_code == 204
        wait_for(lambda: any("security_group_rules" in w for w in heard), 10, "the writes' notifications")
        time.sleep(0.2)      # the replicas' listeners have them too: the passes read them all
        for r in (a, b):
            r.rec.run_pass()
        assert a.rec.model_current() and b.rec.model_current()
        x = next(n for n, i in nodes.items() if b.member.masters(datapath_id(i)))
        y = next(n for n, i in nodes.items() if a.member.masters(datapath_id(i)))
        mine = {datapath_id(i) for i in nodes.values() if a.member.masters(datapath_id(i))}
        a.sent.clear()

        # a port on b's node, made through b (written at once, its notice in the statement)
        for r in (a, b):
            r.rec._wake.clear()
        ofports[x]["vif-z"] = max(ofports[x].values()) + 1
        port = b.http.post("/v1/ports", json={"network_id": green, "name": "z", "node": x,
                                              "interface_name": "vif-z"}).json()["id"]
        assert b.rec._wake.is_set() and "api" in b.rec._events.triggers     # b's own: at once
        wait_for(lambda: any(("port", port) in w for w in heard), 10, "b's write's notification")
        assert ("port_at", (port, None, nodes[x], green)) in next(w for w in heard if ("port", port) in w)
        wait_for(lambda: a.rec._events.store_later or a.rec._wake.is_set(), 10, "b's write to reach a")
        assert "feed" not in a.rec._events.triggers                          # deferred, not woken
        wait_for(lambda: a.rec._wake.is_set(), 10, "a's deferred pass to be due")
        assert a.rec._events.triggers == {"deferred"}
        b.rec.run_pass(audit=False)
        a.rec.run_pass(audit=False)
        assert port in {p.id for p in a.rec.model.ports} and flows_of(fakes.switches[datapath_id(nodes[x])], port)
        assert sum(a.sent[d] for d in mine) == 0 and a.rec.defer_mismatches == 0

        # the same network on a's node (given its groups: written in a transaction): a wakes at once,
        # as the master of the port's node, without asking the apps' reach
        reached = []
        real_reach = cluster.port_write_reach
        monkeypatch.setattr(cluster, "port_write_reach", lambda model, writes: (reached.append(model),
                                                                                real_reach(model, writes))[1])
        a.rec._wake.clear()
        ofports[y]["vif-w"] = max(ofports[y].values()) + 1
        near = b.http.post("/v1/ports", json={"network_id": green, "name": "w", "node": y, "interface_name": "vif-w",
                                              "security_groups": []}).json()["id"]
        wait_for(lambda: "feed" in a.rec._events.triggers, 10, "b's write to wake a")
        assert not any(model is a.rec.model for model in reached) and reached   # b, not its master, asked
        assert ("port_at", (near, None, nodes[y], green)) in next(w for w in heard if ("port", near) in w)
        for r in (a, b):
            r.rec.run_pass(audit=False)

        # a reach made wrong: a port on b's node now changes a's switch (green's flood to it)
        monkeypatch.setattr(cluster, "port_write_reach", lambda model, writes: frozenset())
        a.rec._wake.clear()
        ofports[x]["vif-v"] = max(ofports[x].values()) + 1
        b.http.post("/v1/ports", json={"network_id": green, "name": "v", "node": x, "interface_name": "vif-v"})
        wait_for(lambda: a.rec._wake.is_set(), 10, "a's deferred pass to be due")
        assert a.rec._events.triggers == {"deferred"}
        a.rec.run_pass(audit=False)
        assert a.rec.defer_mismatches == 1 and a.rec.mismatches == 1
    finally:
        listener.stop()
        a.close()
        b.close()
