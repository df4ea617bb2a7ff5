"""One replica's mastership: a thread that runs the lease rounds of fathom.cluster.leases every
`renew` seconds, and what the rest of the controller asks of it (`MastershipView`).

The replica is master of a switch while `epoch(switch)` is not None. That answer holds until the
lease's end as this process can know it without asking: the monotonic time at which it sent the
round that last renewed the lease, plus the lease time, minus a guard. A replica that is paused or
cut off from PostgreSQL stops being master by that deadline on its own, before any other replica can
take the lease (PostgreSQL ends it later: lease time after that round's commit). A paused process
that resumes may act on an answer it got before the pause: the switch refuses it (the new master's
generation_id), which is what fathom.controller.switch.NotMaster reports.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Callable, Iterable, Protocol

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.pool import NullPool

from fathom.cluster import leases
from fathom.cluster.leases import ClusterError, Timing
from fathom.store.db import connect_args

LOG = logging.getLogger("fathom.cluster")


def new_replica_id() -> str:
    """A replica's id for one run of it: its leases, its notifications and its sessions' names."""
    return uuid.uuid4().hex[:12]


class MastershipView(Protocol):
    """What the reconciler asks of the cluster: which switches this replica is master of, under
    which epoch (the generation_id of its master role request), and to be told when that changes.
    `on_gain(switch, epoch)` and `on_loss(switch)` are set by the consumer and called from the
    mastership's thread: after on_loss, write nothing more to that switch."""
    on_gain: Callable[[str, int], None]
    on_loss: Callable[[str], None]

    def epoch(self, switch: str) -> int | None: ...


class SingleController:
    """No cluster (one controller, SQLite or PostgreSQL): master of every switch, always, under epoch 0.
    A reconciler under it requests no role: its connections stay equal, as a lone controller's."""

    def __init__(self):
        self.on_gain: Callable[[str, int], None] = lambda switch, epoch: None
        self.on_loss: Callable[[str], None] = lambda switch: None

    def epoch(self, switch: str) -> int | None:
        return 0


class _Metrics:
    """The cluster's Prometheus families, on prometheus_client's default registry (/metrics); made
    at first use and shared by every Mastership of the process (tests run several)."""
    _made: dict = {}
    _lock = threading.Lock()

    def __getattr__(self, name):
        with self._lock:
            if not self._made:
                from prometheus_client import Counter, Gauge
                self._made.update(
                    held=Gauge("fathom_cluster_leases_held", "switch leases this process holds (it is their master)"),
                    changes=Counter("fathom_cluster_lease_changes", "leases this process took (gained) or stopped "
                                    "holding (released: balance or stop; lost: expired or taken)", ["change"]),
                    failures=Counter("fathom_cluster_renewal_failures",
                                     "lease rounds that failed (PostgreSQL unreachable or erroring)"),
                    ended=Counter("fathom_cluster_stale_replicas_ended", "replicas whose PostgreSQL sessions this "
                                  "process ended, their heartbeat older than the keep time"),
                    queue=Gauge("fathom_cluster_notify_queue_usage", "the share of PostgreSQL's notification "
                                "queue in use (the change feed's), as this process last read it"),
                )
        return self._made[name]


METRICS = _Metrics()


class Mastership:
    """This replica in the cluster on `engine` (PostgreSQL). `switches()` names the switches that
    need a master (their lease rows are made as they appear). `start()` joins (ClusterError: SQLite,
    or a live replica with another schema or PKI) and starts the rounds; `stop()` gives the leases
    up so the others take them at once. With `reachable_only`, `switches()` are the switches this
    replica has an OpenFlow connection to, and it holds no lease of any other. `feed_lag()` is
    written with each heartbeat (the change feed's lag, fathom.cluster.feed), and so are `agents()`
    (node -> seconds since this replica heard its agent) and `switch_states` (what the switches it
    masters say when not simply `ok`, set by its consumer). What the other live replicas wrote is
    kept after each round: `reports` (switch -> [state, refused], from each switch's master;
    `on_reports()` when they changed), `peers` (their OpenFlow listeners), `listeners` (those of
    every replica seen within `Timing.keep`, a late one included: the switches' controller targets;
    `on_peers()` when that set changed), `replicas` (their APIs) and `agent_heard(node)`. A round
    where nothing changed calls only `on_round()`, which every round that reached PostgreSQL calls."""

    def __init__(self, engine: Engine, switches: Callable[[], Iterable[str]], *, replica_id: str | None = None,
                 address: str = "", schema_version: str | None = None, pki_fingerprint: str = "insecure",
                 timing: Timing = Timing(), openflow: str = "", reachable_only: bool = False,
                 feed_lag: Callable[[], float | None] = lambda: None,
                 agents: Callable[[], dict[str, float]] = dict):
        leases.require_postgres(engine)
        if schema_version is None:
            from fathom.store.db import current_revision
            schema_version = current_revision(engine) or "none"
        # its own statements notify no change feed (fathom.cluster.feed): a round is not a store change
        self.engine, self.switches, self.timing = engine.execution_options(feed=False), switches, timing
        self.openflow, self.reachable_only, self.feed_lag = openflow, reachable_only, feed_lag
        self.agents = agents
        self.switch_states: dict[str, list] = {}
        self.reports: dict[str, list] = {}   # the other replicas' (the last round's)
        self.on_reports: Callable[[], None] = lambda: None
        self.on_peers: Callable[[], None] = lambda: None
        self.on_round: Callable[[], None] = lambda: None     # after each round that reached PostgreSQL
        self._agents_heard: dict[str, float] = {}   # node -> epoch seconds another replica last heard its agent
        self._agents_at: dict[str, str] = {}        # node -> API address of the replica that heard it last
        self.taken: set[str] = set()        # switches with a valid lease, any holder (the last round's)
        self.peers: dict[str, str] = {}     # live replicas' OpenFlow listeners (id -> host:port)
        self.listeners: dict[str, str] = {}  # the same, of every replica seen within Timing.keep
        self._reaches: tuple[frozenset, str] = (frozenset(), "")   # the last reachable set, comma-joined
        self.replicas: dict[str, str] = {}  # the other live replicas' API addresses (id -> URL)
        self.id = replica_id or new_replica_id()
        self.address, self.schema_version, self.fingerprint = address, schema_version, pki_fingerprint
        self.on_gain: Callable[[str, int], None] = lambda switch, epoch: None
        self.on_loss: Callable[[str], None] = lambda switch: None
        self._held: dict[str, int] = {}
        self._known: set[str] = set()     # switches whose lease rows this replica made sure of
        self._told: dict[str, int] = {}   # what on_gain said and no on_loss took back (switch -> epoch)
        self._valid_until = 0.0          # monotonic: the held leases' end as this process knows it
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # the rounds' own connection (_round_connection), of an engine without a pool: its session
        # limits (leases.limit_session) reach no other user, even if it is dropped unclosed
        self._rounds = create_engine(engine.url, poolclass=NullPool,
                                     connect_args=connect_args(engine.url.query, f"fathom leases {self.id}"))
        self._conn: Connection | None = None
        self._view = leases.LeaseView()     # the leases as the rounds last read them (leases._ROUND)
        self._written = leases.Written()    # what the rounds last wrote of this replica's row, on self._conn
        self.failures = 0                  # rounds that failed
        self._stale_checked = time.monotonic()   # when this replica last ended stale replicas' sessions

    # ------------------------------------------------------------------ MastershipView

    def epoch(self, switch: str) -> int | None:
        with self._lock:
            if time.monotonic() >= self._valid_until:
                return None
            return self._held.get(switch)

    def agent_heard(self, node: str) -> float | None:
        """When another replica last heard `node`'s agent (epoch seconds, this host's clock; None:
        none has since this one started)."""
        return self._agents_heard.get(node)

    def agent_replica(self, node: str) -> str | None:
        """The API address of the live replica that heard `node`'s agent last (None: no other)."""
        return self._agents_at.get(node)

    def held(self) -> dict[str, int]:
        """The leases held and still valid (switch -> epoch)."""
        with self._lock:
            return dict(self._held) if time.monotonic() < self._valid_until else {}

    # ------------------------------------------------------------------ life

    def join(self) -> "Mastership":
        with self.engine.begin() as conn:
            leases.join(conn, self.id, self.address, self.schema_version, self.fingerprint, self.timing,
                        self.openflow, "" if self.reachable_only else None)
        self._written = leases.Written()
        LOG.info("replica %s joined the cluster (lease %.2f s, renewal every %.2f s)", self.id,
                 self.timing.lease, self.timing.renew)
        return self

    def start(self, joined: bool = False) -> "Mastership":
        """Join (unless `joined` already) and start the rounds."""
        if not joined:
            self.join()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"mastership-{self.id}")
        self._thread.start()
        return self

    def stop(self, leave: bool = True) -> None:
        """End the rounds; with `leave`, give every lease up and unregister (without: as if killed)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        self._end_connection()
        self._drop("released" if leave else "lost")
        if leave:
            with self.engine.begin() as conn:
                leases.leave(conn, self.id)

    def _loop(self) -> None:
        last = None
        while not self._stopping.is_set():
            started = time.monotonic()
            if last is not None and started - last > self.timing.lease - self.timing.guard:
                # its leases passed their deadline meanwhile (others may have taken them): say why
                LOG.warning("replica %s: lease round %.2f s after the previous one (lease %.2f s)", self.id,
                            started - last, self.timing.lease)
            last = started
            self._expire_if_due()
            try:
                self.run_round()
            except ClusterError as e:     # our replica row is gone: no lease can be ours any more
                LOG.error("%s: this replica stops taking leases", e)
                self._end_connection()
                self._drop("lost")
                return
            if self._conn is not None and time.monotonic() - self._stale_checked >= self.timing.keep:
                self.end_stale_sessions()
            self._stopping.wait(max(0.0, started + self.timing.renew - time.monotonic()))

    def run_round(self) -> None:
        """One round: its leases renewed, taken or given up, the callbacks called. A failure (PostgreSQL
        down) is counted; leases then end at their local deadline."""
        sent = time.monotonic()
        switches = frozenset(self.switches())
        new = switches - self._known
        if self.reachable_only and switches != self._reaches[0]:
            self._reaches = (switches, ",".join(sorted(switches)))
        try:
            conn = self._round_connection()
            got = leases.run_round(conn, self.id, self.timing, sorted(new),
                                   switches if self.reachable_only else None, self.feed_lag(),
                                   self.agents(), self.switch_states,
                                   self._reaches[1] if self.reachable_only else None, self._view,
                                   self._written)
            conn.commit()     # autocommit: each statement committed already; this ends SQLAlchemy's own
        except ClusterError:
            raise
        except Exception as e:  # noqa: BLE001 - any store failure: count it, the deadline decides
            self._end_connection()
            self.failures += 1
            METRICS.failures.inc()
            LOG.warning("replica %s: lease round failed: %s", self.id, e)
            self._expire_if_due()
            return
        if got.same and got.held is self._held:
            # at rest: the last round's findings, which this one took in, stand (the same leases held,
            # the same replicas, reports and listeners): its leases last longer, the agents aged
            with self._lock:
                self._valid_until = sent + self.timing.lease - self.timing.guard
            self._heard(got)
            self._call(self.on_round)
            return
        self._known |= new
        listeners_changed = set(got.listeners.values()) != set(self.listeners.values())
        self.taken, self.peers, self.listeners = got.taken, got.openflow, got.listeners
        self.replicas = {r: address for r, address in got.addresses.items() if r != self.id and address}
        self._heard(got)
        if got.reports != self.reports:
            self.reports = got.reports
            self._call(self.on_reports)
        with self._lock:
            self._held = got.held     # not changed after its round (the rounds at rest after it return it)
            self._valid_until = sent + self.timing.lease - self.timing.guard
        if got.held != self._told or got.released:
            self._tell(got)
        if listeners_changed:     # after the leases: it asks which switches this replica now sets up
            self._call(self.on_peers)
        self._call(self.on_round)

    def end_stale_sessions(self) -> None:
        """Every `Timing.keep` seconds, after a round that reached PostgreSQL: end the sessions of the
        replicas whose heartbeat is older than that (leases.end_stale_sessions: a paused replica's
        change feed would hold PostgreSQL's notification queue, its transactions their locks)."""
        self._stale_checked = time.monotonic()
        try:
            ended, usage = leases.end_stale_sessions(self._round_connection(), self.timing)
        except Exception as e:  # noqa: BLE001 - any store failure: the next check tries again
            LOG.warning("replica %s: could not end the sessions of stale replicas: %s", self.id, e)
            return
        METRICS.queue.set(usage)
        for replica in ended:
            METRICS.ended.inc()
            LOG.warning("replica %s: ended the PostgreSQL sessions of replica %s, whose heartbeat is older than "
                        "%.0f s (paused or hung: its change feed would hold PostgreSQL's notification queue)",
                        self.id, replica, self.timing.keep)

    def _heard(self, got: leases.Round) -> None:
        """When the other replicas last heard each node's agent, and which of them did last."""
        if not self._agents_heard and not any(got.agents.values()):
            return
        now = time.time()
        at_replica: dict[str, tuple[float, str]] = {}
        for replica, heard in got.agents.items():
            for node, age in heard.items():
                at = now - age
                if at > self._agents_heard.get(node, 0.0):
                    self._agents_heard[node] = at
                if at > at_replica.get(node, (0.0, ""))[0]:
                    at_replica[node] = (at, got.addresses.get(replica, ""))
        self._agents_at = {node: address for node, (_, address) in at_replica.items() if address}

    def _tell(self, got: leases.Round) -> None:
        """The consumer told what changed since it was last told: losses, then gains."""
        # a lease whose epoch changed was lost (and maybe taken again)
        told = dict(self._told)
        self._tell_loss({s for s, e in told.items() if got.held.get(s) != e} - got.released, "lost")
        self._tell_loss(got.released & set(told), "released")
        for switch, epoch in sorted(got.held.items()):
            if told.get(switch) != epoch:
                self._told[switch] = epoch
                METRICS.held.inc()
                METRICS.changes.labels("gained").inc()
                LOG.info("replica %s: master of %s, epoch %d", self.id, switch, epoch)
                self._call(self.on_gain, switch, epoch)

    def _round_connection(self) -> Connection:
        """The rounds' own connection, made at the first round and again after a failure: no pool
        checkout (nor a ping of a pooled connection idle for a while) per round, the session's
        limits (leases.limit_session) set once, and autocommit."""
        if self._conn is None:
            conn = self._rounds.connect()
            try:
                leases.limit_session(conn, self.timing)
            except Exception:
                conn.close()
                raise
            # autocommit: a round at rest is one statement, one round trip (no BEGIN, no COMMIT)
            self._conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        return self._conn

    def _end_connection(self) -> None:
        self._written = leases.Written()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - already broken: nothing to close
                pass

    # ------------------------------------------------------------------ losses

    def _tell_loss(self, switches: set[str], change: str) -> None:
        for switch in sorted(switches):
            if self._told.pop(switch, None) is not None:
                METRICS.held.dec()
                METRICS.changes.labels(change).inc()
                LOG.info("replica %s: no longer master of %s (%s)", self.id, switch, change)
                self._call(self.on_loss, switch)

    def _call(self, callback, *args) -> None:
        """A consumer's callback; its failure is logged and does not stop the rounds."""
        try:
            callback(*args)
        except Exception:  # noqa: BLE001
            LOG.exception("replica %s: mastership callback %s%r failed", self.id, getattr(callback, "__name__", ""), args)

    def _drop(self, change: str) -> None:
        """Everything held ends now (stop, or its deadline passed without a renewal)."""
        with self._lock:
            self._held, self._valid_until = {}, 0.0
        self._tell_loss(set(self._told), change)

    def _expire_if_due(self) -> None:
        if self._told and time.monotonic() >= self._valid_until:
            self._drop("lost")
