"""This controller as one replica of a cluster (`fathom controller --cluster`): which switches its
reconciler writes to, their OpenFlow roles, and which nodes' OVSDB it sets up.

The replica leases only the switches it has an OpenFlow connection to (fathom.cluster.mastership,
`reachable_only`). It reconciles a switch only once the switch granted it the master role under
the lease's epoch (its `generation_id`): on a gain the role is requested, the switch's mirror
dropped and the switch resynced whole; on a loss it stops at once and asks for the slave role
where the connection is still up. A switch that (re)connects starts as an equal connection: the
role is requested again, master or slave as the lease says. Role requests wait for the switch, so
they run on a thread of their own, never on the lease rounds' or OpenFlow's. After each lease round,
a switch whose lease it holds, connected, whose master role is neither granted under the lease's
epoch nor being asked for, is asked again (at most once per lease time): a role request that got no
answer in time, a grant dropped by a "not master" answer that arrived after it, or a grant checked
while a late round had let the lease's deadline pass would otherwise leave the switch with a master
that writes nothing until its lease moves. A connection that os-ken's request service no longer
knows (its role requests fail as an invalid datapath twice in a row, a lease time apart, with no
connection event since) counts as not reaching the switch: the replica gives the lease up at its
next round, for a replica that reaches it.

A node's OVSDB (its bridges, its controller targets: every replica's OpenFlow listener, a late one
included) is set up by the master of its br-int, or by any replica while nobody holds that lease (a
node whose switches reach no replica yet).

Statuses: a switch mastered by another replica is, in this replica's statuses, what its master
reports of it with its heartbeat (its state and the objects whose flows it refused; nothing: `ok`).
Each status has one writer: a node's, and a bound port's, the master of the node's br-int; a
fabric switch's, its master; any other (and those of a switch nobody masters), the first live
replica by id. So no two replicas write one status from views that differ. The agents: a replica
hears only those that poll it, and counts an agent as heard when another replica says it heard
it (fathom.cluster.mastership).
"""
from __future__ import annotations

import logging
import threading
import time
from math import inf
from concurrent.futures import ThreadPoolExecutor

from fathom.apps import PortWrite, port_write_reach
from fathom.cluster import feed
from fathom.cluster.leases import pki_fingerprint
from fathom.cluster.mastership import Mastership
from fathom.controller import channels
from fathom.controller.bootstrap import local_ip_towards
from fathom.controller.switch import ApplyError, NotRegistered
from fathom.model import datapath_id, datapath_id_fabric, datapath_id_phy
from fathom.model.routers import fabric_state

LOG = logging.getLogger("fathom.cluster")


def port_writes(written: set) -> list[tuple] | None:
    """The workload ports' writes a transaction made ((port id, node id before, after, network
    id): fathom.store.changes.port_at), when that is all it wrote: besides them, only those ports'
    own rows (PORT_ROWS: the ports named, their addresses, the tables a delete cascades to) and
    tables the model does not read (MODEL_UNREAD); None for any other write."""
    writes = [value for kind, value in (w for w in written if isinstance(w, tuple)) if kind == "port_at"]
    ports = {w[0] for w in writes}
    for w in written:
        if isinstance(w, str):
            if w not in MODEL_UNREAD:
                return None
        elif not (w[0] == "port_at" or w[0] in ("ip_allocation", "port_cascade")
                  or (w[0] == "port" and w[1] in ports)):
            return None
    return writes or None


# tables a transaction that writes a port may write too that no switch's state reads: a request's
# Idempotency-Key (fathom.api.request_ids)
MODEL_UNREAD = frozenset({"request_ids"})


def switch_name(dpid: int) -> str:
    """A switch's name in the leases: its datapath id in 16 hex digits."""
    return f"{dpid:016x}"


class ClusterMember:
    """Ties a Mastership to the reconciler `reconciler` whose switches are `switches`
    (fathom.controller.switch.OsKenSwitches)."""

    def __init__(self, mastership: Mastership, switches, reconciler):
        self.mastership, self.switches, self.reconciler = mastership, switches, reconciler
        self._granted: dict[int, int] = {}     # dpid -> epoch under which the switch made us its master
        self._first_of: frozenset | None = None   # the switches leased when this replica was last first (None: not)
        self._roles = ThreadPoolExecutor(1, thread_name_prefix="openflow-roles")
        self._asking: dict[int, int] = {}      # dpid -> role requests queued or running
        self._asked: dict[int, float] = {}     # dpid -> when its last role request ended (monotonic)
        self._invalid: dict[int, int] = {}     # dpid -> role requests refused as an invalid datapath in a row
        self._lock = threading.Lock()
        mastership.on_gain = lambda switch, epoch: self._ask(int(switch, 16))
        mastership.on_loss = self._lost
        mastership.on_reports = reconciler.reported_elsewhere
        mastership.on_peers = self.peers_changed
        mastership.on_round = self.roles_due
        reconciler.cluster = self
        reconciler.statuses.writers = self.writers
        reconciler.statuses.announce = lambda statuses, claim: feed.status_notes(mastership.id, statuses, claim)
        # its API's writes, by transaction id: a status another replica heard answers a long-poll
        # once that replica's pass had read the caller's write (fathom.controller.board)
        reconciler.board.written = feed.committed_xid
        reconciler.board.claims = True
        reconciler.claims = self.claim
        self.feed: feed.Listener | None = None    # the change feed (`run`)
        bootstrapper = reconciler.bootstrapper
        bootstrapper.may_write = self.sets_up
        bootstrapper.targets = self.targets

    # ------------------------------------------------------------------ what the reconciler asks

    def claim(self) -> "feed.Claim | None":
        """The writes a store read now reads (fathom.cluster.feed.Claim): the other replicas' the
        feed counted, and this replica's own API writes (each committed before it woke the pass;
        its notification may not be back yet), so a long-poll on another replica that waits for a
        write made here is answered by this pass's statuses. Own writes the feed's snapshot shows
        already are left out: every status notification carries the claim to every replica."""
        if self.feed is None:
            return None
        claim = self.feed.claim()
        own = {xid for xid in self.reconciler.board.own_writes(feed.CLAIM_XIDS) if not claim.covers(xid)}
        return feed.Claim(claim.writer, claim.snapshot, claim.xids | own) if own else claim

    def masters(self, dpid: int) -> bool:
        """Whether this replica writes to the switch now: its lease is valid and the switch granted
        the master role under its epoch."""
        epoch = self.mastership.epoch(switch_name(dpid))
        return epoch is not None and self._granted.get(dpid) == epoch

    def elsewhere(self, dpid: int) -> bool:
        """Whether another replica holds the switch's lease (so reports on it)."""
        return switch_name(dpid) in self.mastership.taken and self.mastership.epoch(switch_name(dpid)) is None

    def reported(self, dpid: int) -> tuple[str, dict[tuple[int, int], str]]:
        """What the switch's master (another replica) says of it: its state and the objects whose
        flows it refused ((cookie kind, object id) -> why)."""
        state, refused = self.mastership.reports.get(switch_name(dpid), ("ok", ()))
        return state, {(kind, obj): why for kind, obj, why in refused}

    def report(self, result, refused_at: dict) -> None:
        """Tell the other replicas (with the next heartbeat) what the switches this replica masters
        say after a pass, where it is not simply `ok`."""
        out = {}
        for key, res in result.switches.items():
            refused = refused_at.get(key, {})
            if res.dpid is not None and self.masters(res.dpid) and (res.state != "ok" or refused):
                out[switch_name(res.dpid)] = [res.state, sorted([k, i, why] for (k, i), why in refused.items())]
        self.mastership.switch_states = out
        self._statuses_gained()

    def _statuses_gained(self) -> None:
        """Read the whole store when this replica became the first (or, being first, a switch's lease
        was freed): statuses another replica wrote, with no notification (fathom.cluster.feed), are
        this one's to write now, compared with the store's as their last writer left them (a
        master's switches: when it is granted them, `_request_role`)."""
        first = min(self.mastership.peers, default=self.mastership.id) == self.mastership.id
        taken = frozenset(self.mastership.taken)
        before, self._first_of = self._first_of, taken if first else None
        if first and (before is None or before - taken):
            self.reconciler.changed_elsewhere()

    def writers(self, snapshot):
        """Whether this replica writes a status key ((kind, id), or ("node_state", node name)), by
        the model `snapshot` (see the module's docstring)."""
        nodes = {n.name: datapath_id(n.id) for n in snapshot.nodes}
        first = min(self.mastership.peers, default=self.mastership.id) == self.mastership.id
        ports = None

        def writes_for(dpid: int | None) -> bool:
            if dpid is None:
                return first
            name = switch_name(dpid)
            return self.mastership.epoch(name) is not None or (first and name not in self.mastership.taken)

        def writes(key) -> bool:
            nonlocal ports
            kind, what = key
            if kind == "node_state":
                return writes_for(nodes.get(what))
            if kind == "node":
                return writes_for(datapath_id(what))
            if kind == "fabric_switch":
                return writes_for(datapath_id_fabric(what))
            if kind == "port":
                if ports is None:
                    ports = {p.id: p.node for p in snapshot.ports}
                return writes_for(nodes.get(ports.get(what)))
            return first
        return writes

    def wakes_for(self, written: set) -> bool:
        """Whether a committed write (the tables and row tokens its notification names: `written`)
        needs a pass of this replica now. A workload port's write through the API (`port_writes`)
        does only when a node whose switches it may change (fathom.apps.port_write_reach, from the
        model this replica last compiled) has its br-int set up by this replica (it masters it, or
        nobody does); any other write, a port bound to no node before or after (its
        status is the first replica's), a node this model does not know, or a model behind a write
        already taken (`Reconciler.model_current`): at once. A write that does not wake a pass is
        read by the next one, within `Reconciler.defer` seconds (`Reconciler.defer_store`)."""
        writes = port_writes(written)
        model = self.reconciler.model
        if not writes or model is None or not self.reconciler.model_current():
            return True
        names = {n.id: n.name for n in model.nodes}
        moves = []
        for port, before, after, network in writes:
            nodes = {before, after} - {None}
            if not nodes or not nodes <= names.keys():
                return True
            moves.append(PortWrite(port, frozenset(names[i] for i in nodes), network))
        # a port's own nodes are in its write's reach: their br-int's master wakes without the rest
        if any(self.sets_up(datapath_id(i)) for _, before, after, _ in writes for i in (before, after) if i is not None):
            return True
        reach = port_write_reach(model, moves)
        if reach is None:
            return True
        ids = {name: i for i, name in names.items()}
        # br-phy: only beside a fabric, whose app's reach is any switch
        return not reach <= ids.keys() or any(self.sets_up(datapath_id(ids[name])) for name in reach)

    def wakes_for_own(self) -> bool:
        """`wakes_for` this thread's last committed write (the API's, as it wakes the reconciler:
        fathom.cluster.feed.committed_written); one it cannot tell: yes."""
        written = feed.committed_written()
        return written is None or self.wakes_for(written)

    def concerns(self, name: str) -> bool:
        """Whether a change of node (or fabric switch) `name`'s interfaces needs a pass of this
        replica now: it sets up the node's br-int (it masters it, or nobody does), or it masters
        its br-phy and the change moved br-phy's port numbers from those the last pass compiled
        with (a VM's interface plugged into br-int moves none); a name it does not know yet: yes.
        Any other replica's next pass reads them from the OVSDB replica, and on gaining the switch
        it re-checks it whole (`_request_role`)."""
        model = self.reconciler.model
        node = next((n for n in model.nodes if n.name == name), None) if model is not None else None
        if node is not None:
            return self.sets_up(datapath_id(node.id)) or self._phy_moved(node)
        fabric = fabric_state(model).switches if model is not None else ()
        switch = next((s for s in fabric if s.name == name), None)
        return switch is None or self.sets_up(datapath_id_fabric(switch.id))

    def _phy_moved(self, node) -> bool:
        """Whether this replica masters `node`'s br-phy and a change moved its port numbers from
        those the last pass compiled with (fathom.controller.fabric.FabricRuntime.phy_moved; not
        known: yes)."""
        if self.mastership.epoch(switch_name(datapath_id_phy(node.id))) is None:
            return False
        from fathom.controller.fabric import FabricRuntime
        fabric = next((e for e in self.reconciler.extensions if isinstance(e, FabricRuntime)), None)
        ovsdb = getattr(self.reconciler.bootstrapper, "nodes", {}).get(node.name)
        if fabric is None or ovsdb is None:
            return True
        try:
            return fabric.phy_moved(node.name, ovsdb)
        except Exception:  # noqa: BLE001 - its replica unreadable now: the pass tells
            return True

    def checks(self, node) -> bool:
        """Whether this replica's periodic check compares `node`'s OVSDB replica with the port
        numbers it compiled with: it sets up the node's br-int (it masters it, or nobody does) or
        masters its br-phy. The other replicas' passes read the node's interfaces anyway, and a
        replica that gains its switch resyncs it whole (`_request_role`)."""
        return (self.sets_up(datapath_id(node.id))
                or self.mastership.epoch(switch_name(datapath_id_phy(node.id))) is not None)

    def sets_up(self, dpid: int) -> bool:
        """Whether this replica sets the switch up over OVSDB: it holds its lease, or nobody does."""
        name = switch_name(dpid)
        return self.mastership.epoch(name) is not None or name not in self.mastership.taken

    def targets(self, management_ip: str) -> list[str]:
        """Every replica's OpenFlow listener as a controller target for a switch managed at
        `management_ip` (a listener with no host: the replicas share this host, reached as this one
        is): the live ones' and those of replicas whose heartbeat stopped less than
        `Timing.keep` ago (a late round must not cost a replica its connections)."""
        out = set()
        for listener in self.mastership.listeners.values():
            host, _, port = listener.rpartition(":")
            if port.isdigit():
                out.add(channels.controller_target(host or local_ip_towards(management_ip), int(port)))
        return sorted(out) or [channels.controller_target(local_ip_towards(management_ip),
                                                          self.reconciler.bootstrapper.controller_port)]

    # ------------------------------------------------------------------ events

    def peers_changed(self) -> None:
        """The replicas' OpenFlow listeners changed (one joined, left, or has sent no heartbeat for
        `Timing.keep`): the switches this replica sets up (a node's br-int or br-phy, a fabric
        switch) get their controller targets written again, so every switch reaches every live
        replica (a replica a switch does not reach gets no lease of it)."""
        model = self.reconciler.model
        fabric = fabric_state(model).switches if model else ()   # br-phy is set up only beside a fabric switch
        for node in (model.nodes if model else ()):
            if self.sets_up(datapath_id(node.id)) or (fabric and self.sets_up(datapath_id_phy(node.id))):
                self.reconciler.recheck_setup(node.name)
        for switch in fabric:
            if self.sets_up(datapath_id_fabric(switch.id)):
                self.reconciler.recheck_setup(switch.name)

    def connected(self, dpid: int) -> None:
        """A switch (re)connected or went away: a new connection is equal; ask for our role."""
        self._granted.pop(dpid, None)
        self._invalid.pop(dpid, None)
        self._ask(dpid)

    def reaches(self) -> list[str]:
        """The switches this replica leases: those connected, but a connection os-ken's request
        service refused twice in a row (see the module's docstring)."""
        return [switch_name(d) for d in self.switches.connected() if self._invalid.get(d, 0) < 2]

    def not_master(self, dpid: int) -> None:
        """The switch says another controller is its master (role status, IS_SLAVE)."""
        if self._granted.pop(dpid, None) is not None:
            LOG.info("switch %s: another replica took the master role", switch_name(dpid))
            self.reconciler.applier.forget(dpid)

    def _lost(self, switch: str) -> None:
        dpid = int(switch, 16)
        self._granted.pop(dpid, None)      # first: no pass writes to it from now on
        self.reconciler.applier.forget(dpid)
        self._ask(dpid)

    def _ask(self, dpid: int) -> None:
        with self._lock:
            self._asking[dpid] = self._asking.get(dpid, 0) + 1
        self._roles.submit(self._request_role, dpid)

    def roles_due(self) -> None:
        """After a lease round: the master role asked again of each connected switch whose lease
        this replica holds and whose role is neither granted under that epoch nor being asked for,
        its last request ended a lease time ago or more (see the module's docstring)."""
        now = time.monotonic()
        for switch, epoch in self.mastership.held().items():
            dpid = int(switch, 16)
            if self._granted.get(dpid) == epoch:     # at rest: every held switch granted
                continue
            with self._lock:
                due = (self._granted.get(dpid) != epoch and dpid not in self._asking
                       and now - self._asked.get(dpid, -inf) >= self.mastership.timing.lease)
            if due and self.switches.session(dpid) is not None:
                LOG.info("switch %s: lease held under epoch %d, master role not granted: asking again", switch, epoch)
                self._ask(dpid)

    def _request_role(self, dpid: int) -> None:
        try:
            self._role_now(dpid)
        finally:
            with self._lock:
                left = self._asking.pop(dpid, 1) - 1
                if left:
                    self._asking[dpid] = left
                self._asked[dpid] = time.monotonic()

    def _role_now(self, dpid: int) -> None:
        """The role the lease says, now: master under its epoch (then a whole resync), else slave."""
        session = self.switches.session(dpid)
        if session is None:
            return
        epoch = self.mastership.epoch(switch_name(dpid))
        try:
            session.request_role(epoch)
        except (ApplyError, NotRegistered) as e:   # NotMaster: stale epoch (another is master); no answer
            if isinstance(e, NotRegistered):       # in time; gone, or a connection os-ken's requests no longer know
                self._invalid[dpid] = self._invalid.get(dpid, 0) + 1
            LOG.warning("switch %s: role request (%s) failed: %s", switch_name(dpid),
                        "slave" if epoch is None else f"master, epoch {epoch}", e)
            return
        self._invalid.pop(dpid, None)
        if epoch is None:
            return
        if self.mastership.epoch(switch_name(dpid)) == epoch:
            self._granted[dpid] = epoch
            LOG.info("switch %s: master under epoch %d; resyncing it", switch_name(dpid), epoch)
            self.reconciler.applier.forget(dpid)     # its mirror may be stale: read it back
            self.reconciler.switch_changed(dpid)
            # the statuses it now writes: compared with the store's, as the previous writer left them
            self.reconciler.changed_elsewhere()

    def stop(self) -> None:
        self.mastership.stop()
        self._roles.shutdown(wait=False, cancel_futures=True)


def join(engine, *, address: str, openflow: str, pki_dir: str | None, replica_id: str | None = None) -> Mastership:
    """This process's Mastership (as `replica_id`), joined (ClusterError: not PostgreSQL, or a live
    replica runs another schema or PKI), its rounds not started yet (`run`); its writes notify the
    change feed."""
    mastership = Mastership(engine, lambda: (), replica_id=replica_id, address=address, openflow=openflow,
                            pki_fingerprint=pki_fingerprint(pki_dir), reachable_only=True)
    mastership.join()
    feed.notify_commits(engine, mastership.id)
    return mastership


def run(mastership: Mastership, switches, reconciler, app, hub) -> ClusterMember:
    """Start the replica's rounds and change feed, the OpenFlow app's events routed to it. It leases
    the switches connected to `switches` (OsKenSwitches). `hub` (fathom.api.agents.AgentHub): the
    agents this replica hears, told to the others, and those they hear; when another replica wrote
    the store, the agents' long-polls are woken (besides the reconciler)."""
    mastership.agents, hub.heard_elsewhere, hub.polls_elsewhere = hub.present, mastership.agent_heard, \
        mastership.agent_replica
    member = ClusterMember(mastership, switches, reconciler)
    mastership.switches = member.reaches

    def switch_changed(dpid, datapath=None):
        reconciler.switch_changed(dpid, datapath)
        member.connected(dpid)
    app.on_switch = switch_changed
    app.on_not_master = member.not_master

    def elsewhere(written: set):
        reconciler.written_elsewhere(written)
        hub.changed()
    listener = member.feed = feed.follow(mastership.engine, mastership.id, elsewhere, reconciler.board.heard)
    mastership.feed_lag = lambda: listener.lag
    mastership.start(joined=True)
    return member
