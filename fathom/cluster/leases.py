"""Replicas and switch leases in PostgreSQL: the statements, each round one transaction.

Every time is PostgreSQL's clock (`clock_timestamp()`, the real time inside a transaction), never a
replica's: a replica whose clock is wrong or jumps changes nothing. A replica is live while its
heartbeat is younger than the lease time. A switch's lease row is never deleted, so its epoch never
goes back; the epoch grows by one each time the lease is taken, and it is the OpenFlow generation_id
of the holder's master role request (fathom.controller.switch): a switch refuses a request with an
older one (OFPRRFC_STALE), and a newer master demotes the older to slave (OFPBRC_IS_SLAVE on its
writes).

A lease is valid while its holder's heartbeat (its row in cluster_replicas) is younger than the
lease time: a round renews every lease its replica holds by writing that one row. One switch never
has two holders: a lease is taken only from rows locked with `FOR UPDATE SKIP LOCKED` that are free,
or whose holder's heartbeat is stale, when locked (PostgreSQL re-reads a row changed meanwhile), and
the stale holder's row is locked by the take until it commits, while a holder writes its heartbeat
only if it is not stale (_ROUND, _TAKE).

Balance: the live replicas, ordered by id, have fair shares of the switches that differ by one at
most (the first `switches % replicas` take one more). Each round decides from one view of the
replicas and leases read at one instant of PostgreSQL's clock: a replica takes expired leases and
freed ones (HANDOVER_BATCH a round, unless it is alone) up to its share, and gives up what it holds above its share only
toward live replicas below theirs that reach the switch, and no more than they still lack once they
took the free leases they reach; a switch that no live replica below its share reaches is taken,
beyond its share, by one that reaches it once it has had no master for a lease time. So when a
replica joins, each replica above its share frees exactly its surplus, the joiner takes what was
freed, and every switch that moves, moves once; with a stable membership nothing moves. A holder whose round comes late renews
its leases that nobody took meanwhile, under the same epoch.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from psycopg import pq
from psycopg.adapt import Transformer
from psycopg.errors import error_from_result
from sqlalchemy import Connection, Engine, inspect, text


class ClusterError(Exception):
    """This process cannot be a replica of the cluster; the message says why and what to do."""


class LateHeartbeat(Exception):
    """A round whose heartbeat aged out again between its revival and the round's statement (a
    starved or paused process): the round failed, the next one tries again."""


@dataclass(frozen=True)
class Timing:
    """`renew`: seconds between a replica's rounds (heartbeat, renewal, balance); `lease`: how long a
    lease and a heartbeat last after the round that wrote them (PostgreSQL's clock); `guard`: how much
    before its lease's end, counted on its monotonic clock from when it sent the round, a holder stops
    acting as master."""
    renew: float = 0.33
    lease: float = 1.0
    guard: float = 0.1

    @property
    def keep(self) -> float:
        """How long a replica whose heartbeat stopped stays in the switches' controller targets (ten
        lease times): a round that comes late is not a departure, and a switch that dropped the
        replica's connection would take its reach, and so its leases, away."""
        return 10 * self.lease

    def __post_init__(self):
        if not 0 < self.renew < self.lease or not 0 <= self.guard < self.lease - self.renew:
            raise ValueError(f"lease timing: need 0 < renew < lease and 0 <= guard < lease - renew, got {self}")


def require_postgres(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        raise ClusterError(f"a cluster of controllers needs PostgreSQL (its leases use PostgreSQL's clock and row "
                           f"locks); this store is {engine.dialect.name} ({engine.url.render_as_string()}). Run one "
                           f"controller on it, or give every replica the same postgresql:// URL.")


def pki_fingerprint(pki_dir: str | Path | None) -> str:
    """SHA-256 (hex) of the CA certificates of the PKI in `pki_dir` (controller CA, then switch CA);
    "insecure" without a PKI (plain TCP)."""
    if pki_dir is None:
        return "insecure"
    digest = hashlib.sha256()
    for ca in ("controllerca", "switchca"):
        digest.update((Path(pki_dir) / ca / "cacert.pem").read_bytes())
    return digest.hexdigest()


# the most freed leases (given up by a replica above its share or one that stopped, or never held)
# a replica takes in one round: each one it gains is a role request and a resync of the switch,
# and a replica that took its whole share at once (a joiner: 33 of 100 switches) spends its next
# rounds' time on them; a round late by a lease time loses them all to the others (it is not live
# then), which hand them back. So it takes its share a batch a round, each renewed by the next
# round before the next batch. A lease whose holder's lease ran out (killed, paused, or late) is
# taken at once.
HANDOVER_BATCH = 8
_SECONDS = "make_interval(secs => :lease)"
_LIVE = f"heartbeat > clock_timestamp() - {_SECONDS}"


def join(conn: Connection, me: str, address: str, schema_version: str, fingerprint: str, timing: Timing,
         openflow: str = "", reaches: str | None = None) -> None:
    """Register replica `me`, or refuse it (ClusterError) when a live replica runs another schema
    version or PKI. Joins queue on one transaction lock, so two replicas cannot both be first.
    `reaches`: "" for a replica that leases only the switches it reaches (it reaches none yet: no
    lease is freed toward it before its rounds say which), None for one that may master any."""
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('fathom cluster join'))"))
    others = conn.execute(text(f"SELECT id, address, schema_version, pki_fingerprint FROM cluster_replicas "
                               f"WHERE {_LIVE} AND id <> :me ORDER BY id"), {"lease": timing.lease, "me": me}).all()
    for other in others:
        if (other.schema_version, other.pki_fingerprint) != (schema_version, fingerprint):
            raise ClusterError(
                f"replica {me} refused: live replica {other.id} ({other.address or 'no address'}) runs schema "
                f"{other.schema_version} with PKI {other.pki_fingerprint[:16]}, this one schema {schema_version} "
                f"with PKI {fingerprint[:16]}. The replicas of one cluster share one schema version and one PKI "
                f"(the same CA certificates): upgrade or stop the others first, or give this one their PKI.")
    conn.execute(text(
        "INSERT INTO cluster_replicas (id, address, started, heartbeat, schema_version, pki_fingerprint, "
        "openflow, reaches) "
        "VALUES (:me, :address, clock_timestamp(), clock_timestamp(), :schema, :fp, :openflow, :reaches)"),
        {"me": me, "address": address, "schema": schema_version, "fp": fingerprint, "openflow": openflow,
         "reaches": reaches})


def shared_key(engine: Engine, name: str) -> bytes:
    """The cluster's key `name` (cluster_keys): 32 random bytes made by the first replica that asks,
    the same for every replica after it."""
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO cluster_keys (name, key) VALUES (:name, :key) ON CONFLICT (name) DO NOTHING"),
                     {"name": name, "key": os.urandom(32)})
        return bytes(conn.execute(text("SELECT key FROM cluster_keys WHERE name = :name"), {"name": name}).scalar_one())


def check_schema(engine: Engine, schema_version: str, timing: Timing = Timing()) -> None:
    """Before this replica migrates the store to `schema_version`: ClusterError when a live replica
    runs another one (migrating would change the schema under it). A store with no cluster yet, or
    not PostgreSQL (join says why), passes."""
    if engine.dialect.name != "postgresql":
        return
    with engine.connect() as conn:
        if not inspect(conn).has_table("cluster_replicas"):
            return
        other = conn.execute(text(f"SELECT id, address, schema_version FROM cluster_replicas WHERE {_LIVE} "
                                  f"AND schema_version <> :schema ORDER BY id LIMIT 1"),
                             {"lease": timing.lease, "schema": schema_version}).first()
    if other is not None:
        raise ClusterError(
            f"this replica (schema {schema_version}) refused before migrating the store: live replica {other.id} "
            f"({other.address or 'no address'}) runs schema {other.schema_version}. The replicas of one cluster "
            f"share one schema version: stop the others first (docs/ha.md, upgrades).")


def ensure_switches(conn: Connection, switches) -> None:
    """Lease rows (free, epoch 0) for the switches that have none."""
    switches = list(switches)
    if switches:
        conn.execute(_ENSURE, {"switches": switches})


@dataclass
class Round:
    """What one round found and did: `held` the leases this replica holds after it (switch -> epoch),
    `released` the switches it gave up in it, `taken` every switch with a valid lease (any holder),
    `openflow` the live replicas' OpenFlow listeners (id -> host:port), `listeners` those of every
    replica whose heartbeat is younger than `Timing.keep` (the switches' controller targets: a
    replica whose round is late is not a departure), `addresses` the live replicas' APIs (id ->
    URL). From the other live replicas' heartbeats: `agents`, the nodes whose agents each hears (id
    -> node -> seconds since it heard the agent, as of this round), and `reports`, what a switch's
    master says of it when not simply `ok` (switch -> [state, [[cookie kind, object id, why
    refused], ...]]), from its lease's holder only. `same`: the last round's findings, unchanged (a
    round at rest: only the heartbeat renewed, and `agents` aged as of this round)."""
    held: dict[str, int] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    taken: set[str] = field(default_factory=set)
    openflow: dict[str, str] = field(default_factory=dict)
    listeners: dict[str, str] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    agents: dict[str, dict[str, float]] = field(default_factory=dict)
    reports: dict[str, list] = field(default_factory=dict)
    same: bool = False


@dataclass
class LeaseView:
    """A replica's copy of every lease ([switch, holder, None, False]) as its last round read it when
    every lease had a live holder, and the leases' stamp then (None: no such copy); `rest`: what a
    round from that copy that changed nothing saw and found (its live replicas and their reaches, its
    leases; the valid holders and every switch with one). `kept`: the leases the replica held as its
    last full round read them (switch -> epoch); `peers`: the rows of the replicas it saw (id ->
    (digest, [reaches, address, openflow, agents, switch_states])), so that a round at rest (_REST)
    can tell from their digests that they did not change; `holders`: the holders in `rows`. `last`:
    the last round's Round when that round changed nothing, and the liveness of the other replicas
    it saw ((id, live), ...): a round at rest that finds the same returns it (`Round.same`)."""
    stamp: str | None = None
    rows: list = field(default_factory=list)
    holders: frozenset = frozenset()
    rest: tuple | None = None
    kept: dict | None = None
    peers: dict = field(default_factory=dict)
    last: Round | None = None
    last_live: tuple = ()


@dataclass
class Written:
    """What a replica's rounds last wrote of its own row on their connection: its `reaches`, `agents`
    and `switch_states` (as sent), and whether they are known to be in the row (`known`: False
    after a new connection, a failed round or a join: the next round sends them all)."""
    known: bool = False
    reaches: str | None = None
    agents: str | None = None
    states: str | None = None


def shares(replicas: list[str], switches: int) -> dict[str, int]:
    """Each live replica's fair share: replicas ordered by id, the first `switches % n` one more."""
    n = len(replicas)
    return {r: switches // n + (1 if i < switches % n else 0) for i, r in enumerate(sorted(replicas))} if n else {}


def limit_session(conn: Connection, timing: Timing) -> None:
    """The limits of a session that runs rounds (a connection of its own, never returned to a pool
    whose other users would inherit them): a round that cannot finish within the lease time (locks
    held, a stalled server) fails instead of waiting: the leases end at the holder's deadline
    either way, and the failure is counted; and a round whose replica stops mid-way (paused) has
    its session ended after the lease time, so the lease rows it locked are free to be taken (SKIP
    LOCKED would pass over them for as long). Its commits do not wait for the WAL's flush
    (`synchronous_commit` off): a heartbeat, or a lease freed, that a PostgreSQL crash loses is
    harmless, as no holder counts as stale within a lease time of PostgreSQL's start (_TAKE); a
    take (an epoch raised) and a new lease row are committed synchronously all the same."""
    conn.execute(text("SELECT set_config('statement_timeout', :ms, false), "
                      "set_config('idle_in_transaction_session_timeout', :ms, false), "
                      "set_config('synchronous_commit', 'off', false)"),
                 {"ms": str(int(timing.lease * 1000))})
    conn.commit()

# what a replica's row says besides its heartbeat and feed lag (a digest: a round at rest compares it
# with the one of the row it keeps, _REST): PostgreSQL's 64-bit text hash of each field, hashed again
# as one array (a NULL field stays NULL in it): a fifth of the CPU of an MD5 of the row's text, most
# of which is the record's conversion to text (its `reaches` 1.7 KB with 100 switches). A change is
# missed only by a collision of the hash (odds of 2^-64).
_DIGEST = ("hashtextextended(ARRAY[hashtextextended(r.reaches, 0), hashtextextended(r.address, 0), "
           "hashtextextended(r.openflow, 0), hashtextextended(r.agents, 0), "
           "hashtextextended(r.switch_states, 0)]::text, 0)")
# A lease is valid while its holder's heartbeat is younger than the lease time: a round renews every
# lease its replica holds by writing its one heartbeat row, never the lease rows. The round's one
# statement when anything changed (psycopg's placeholders: it is sent as is, and prepared by the
# driver; at rest a slimmer one, _REST, below): the heartbeat, written only while it is still live (`beat` is empty when it had
# aged out: `run_round` then revives it apart, see there); the leases of switches it no longer reaches
# freed (`mine`: what it reaches, the row's value when the round does not send it: unchanged); and
# the round's one view, at one instant of PostgreSQL's clock, as of the statement's start:
# the leases it holds ([switch, epoch], those it still reaches), the replicas whose heartbeat is
# younger than the keep time ([id, live, reaches, address, openflow, agents, switch_states, heartbeat
# age, digest of its row]), the leases' stamp (their count and last change: a take, a free and a new row each set
# `renewed` to PostgreSQL's time) and every lease ([switch, valid holder or null, seconds without a
# master or null, whether it was freed rather than ran out]) unless every lease has a live holder and
# the stamp is the caller's `stamp`: then the caller's copy of that list, read when every lease had a
# live holder, is still the view (a round at rest reads no lease row into its answer). The leases
# it holds as of the statement's start are still its own: a lease is taken from a holder only while
# the holder's heartbeat row is stale and locked by the taker (_TAKE), and this statement writes
# that row only while it is not stale.
_ROUND = (
    "WITH mine AS (SELECT CASE WHEN %(new_reaches)s THEN CAST(%(reaches)s AS text) ELSE reaches END AS reaches "
    "              FROM cluster_replicas WHERE id = %(me)s), "
    "reach AS (SELECT unnest(string_to_array((SELECT reaches FROM mine), ',')) AS switch), "
    "beat AS (UPDATE cluster_replicas SET heartbeat = clock_timestamp(), feed_lag = %(lag)s, "
    "         reaches = CASE WHEN %(new_reaches)s THEN CAST(%(reaches)s AS text) ELSE reaches END, "
    "         agents = CASE WHEN %(new_agents)s THEN CAST(%(agents)s AS text) ELSE agents END, "
    "         switch_states = CASE WHEN %(new_states)s THEN CAST(%(states)s AS text) ELSE switch_states END "
    "         WHERE id = %(me)s AND heartbeat > clock_timestamp() - make_interval(secs => %(lease)s) RETURNING id), "
    "gone AS (UPDATE cluster_leases SET holder = NULL, renewed = clock_timestamp() WHERE holder = %(me)s "
    "         AND EXISTS (SELECT 1 FROM beat) "
    "         AND (SELECT reaches FROM mine) IS NOT NULL AND switch NOT IN (SELECT switch FROM reach) "
    "         RETURNING switch), "
    "now AS (SELECT clock_timestamp() AS t) "
    "SELECT (SELECT count(*) FROM beat), "
    "       (SELECT coalesce(json_object_agg(switch, epoch), '{}') FROM cluster_leases WHERE holder = %(me)s "
    "        AND ((SELECT reaches FROM mine) IS NULL OR switch IN (SELECT switch FROM reach))), "
    "       (SELECT coalesce(json_agg(switch), '[]') FROM gone), "
    "       (SELECT coalesce(json_agg(json_build_array(r.id, r.heartbeat > now.t - make_interval(secs => %(lease)s), "
    "                r.reaches, r.address, r.openflow, r.agents, r.switch_states, "
    "                extract(epoch FROM now.t - r.heartbeat), " + _DIGEST + ") ORDER BY r.id), '[]') "
    "        FROM cluster_replicas r WHERE r.heartbeat > now.t - make_interval(secs => %(keep)s)), "
    "       lv.stamp, "
    "       CASE WHEN NOT coalesce(lv.held, true) OR lv.stamp IS DISTINCT FROM %(stamp)s THEN "
    "       (SELECT coalesce(json_agg(json_build_array(l.switch, "
    "                CASE WHEN r.heartbeat > now.t - make_interval(secs => %(lease)s) THEN l.holder END, "
    "                CASE WHEN r.heartbeat IS NULL OR r.heartbeat <= now.t - make_interval(secs => %(lease)s) "
    "                     THEN coalesce(extract(epoch FROM now.t - coalesce(r.heartbeat, l.renewed)), 1e9) "
    "                          - %(lease)s END, "
    "                l.holder IS NULL)), '[]') "
    "        FROM cluster_leases l LEFT JOIN cluster_replicas r ON r.id = l.holder) END "
    "FROM now, (SELECT count(*) || ' ' || coalesce(max(l.renewed)::text, '') AS stamp, "
    "           bool_and(coalesce(r.heartbeat > now.t - make_interval(secs => %(lease)s), false)) AS held "
    "           FROM now, cluster_leases l LEFT JOIN cluster_replicas r ON r.id = l.holder) AS lv")
# A round at rest: nothing the replica sends changed since its connection's last round, and its last
# round read every lease with a live holder (its copy of them, LeaseView). Its heartbeat, written only
# while it is still live (as _ROUND's), and what tells whether anything else changed, at one instant of
# PostgreSQL's clock as of the statement's start: the leases' stamp (a take, a free and a new row each
# change it), and each replica seen within the keep time ([id], [live], [heartbeat age], [digest of the
# rest of its row]). When the stamp is the copy's, every holder in the copy is still live and every row's
# digest is the one the replica keeps, this is the view _ROUND would give (its lease list left out, its
# own leases those it kept, nothing freed: what it reaches did not change), for a third of its
# PostgreSQL CPU; otherwise the round runs _ROUND. libpq's placeholders ($1...: _REST_PARAMS): it runs
# on the connection's libpq handle (_rest_row).
_REST = (
    "WITH beat AS (UPDATE cluster_replicas SET heartbeat = clock_timestamp(), feed_lag = $3 "
    "              WHERE id = $1 AND heartbeat > clock_timestamp() - make_interval(secs => $2) "
    "              RETURNING id), "
    "now AS (SELECT clock_timestamp() AS t) "
    "SELECT (SELECT count(*) FROM beat), "
    "       (SELECT count(*) || ' ' || coalesce(max(renewed)::text, '') FROM cluster_leases), "
    "       rs.ids, rs.live, rs.ages, rs.digests "
    "FROM now, LATERAL (SELECT array_agg(r.id ORDER BY r.id) AS ids, "
    "                   array_agg(r.heartbeat > now.t - make_interval(secs => $2) ORDER BY r.id) AS live, "
    "                   array_agg(extract(epoch FROM now.t - r.heartbeat)::float8 ORDER BY r.id) AS ages, "
    "                   array_agg(" + _DIGEST + " ORDER BY r.id) AS digests "
    "                   FROM cluster_replicas r WHERE r.heartbeat > now.t - make_interval(secs => $4)) AS rs")
# _REST's parameters ($1...) and their types (text, float8), and its name in a session that runs rounds
_REST_PARAMS = (("me", 25), ("lease", 701), ("lag", 701), ("keep", 701))
_REST_NAME = b"fathom_cluster_rest"
# a replica whose heartbeat aged out (its round came more than a lease time after the last) writes it
# again apart; its leases that nobody took meanwhile are valid again, under the same epoch
_REVIVE = text("UPDATE cluster_replicas SET heartbeat = clock_timestamp() WHERE id = :me RETURNING id")
# take the leases among :candidates that are free, or whose holder's heartbeat is stale (or gone),
# when locked, :n at most, the free ones first; each one's epoch grows. The stale holders' rows are
# locked FOR SHARE (SKIP LOCKED: one being written by its round is live), so a holder's round cannot
# write its heartbeat until this take committed, and then finds it stale (_ROUND's `beat` is
# empty); a lease row another taker changed meanwhile is read again (its holder is then not stale)
_TAKE = text(
    "WITH stale AS (SELECT id FROM cluster_replicas "
    "               WHERE heartbeat <= clock_timestamp() - make_interval(secs => :lease) "
    "               AND pg_postmaster_start_time() <= clock_timestamp() - make_interval(secs => :lease) "
    "               FOR SHARE SKIP LOCKED), "
    "free AS (SELECT switch FROM cluster_leases c WHERE (holder IS NULL OR holder IN (SELECT id FROM stale) "
    "         OR NOT EXISTS (SELECT 1 FROM cluster_replicas r WHERE r.id = c.holder)) "
    "         AND switch = ANY(:candidates) AND set_config('synchronous_commit', 'on', true) IS NOT NULL "
    "         ORDER BY holder NULLS FIRST, switch LIMIT :n FOR UPDATE SKIP LOCKED) "
    "UPDATE cluster_leases AS l SET holder = :me, epoch = l.epoch + 1, expires = NULL, renewed = clock_timestamp() "
    "FROM free WHERE l.switch = free.switch RETURNING l.switch, l.epoch")
# lease rows for new switches, committed synchronously (as a take: see limit_session)
_ENSURE = text("INSERT INTO cluster_leases (switch, epoch) "
               "SELECT s, 0 FROM unnest(CAST(:switches AS text[])) AS s "
               "WHERE set_config('synchronous_commit', 'on', true) IS NOT NULL ON CONFLICT DO NOTHING")
_GIVE = text("UPDATE cluster_leases SET holder = NULL, renewed = clock_timestamp() "
             "WHERE holder = :me AND switch = ANY(:give)")


def _round_row(conn: Connection, q: dict, statement: str = _ROUND) -> tuple:
    """_ROUND's (or _REST's) one row, run on the connection's psycopg cursor (prepared), in the
    connection's transaction: SQLAlchemy's execution and result layers cost a round at rest as much
    CPU again as the driver's. _REST runs lower still (_rest_row)."""
    if statement is _REST:
        return _rest_row(conn, q)
    with conn.connection.driver_connection.cursor() as cur:
        cur.execute(statement, q, prepare=True)
        return cur.fetchone()


def _rest_row(conn: Connection, q: dict) -> tuple:
    """_REST's one row, run on the connection's libpq handle (the GIL released while it waits, as
    psycopg's cursor does), loaded by psycopg's own loaders; in an autocommit session (the rounds'
    own) as a statement prepared once a session, else unprepared (psycopg's rollback of the caller's
    transaction would deallocate it unseen). A round at rest comes every `renew` seconds, its code
    cold in the CPU's caches by then, where psycopg's cursor (its query conversion, adaptation,
    prepared-statement bookkeeping and generators) costs three times the round trip itself."""
    fairy = conn.connection
    driver = fairy.driver_connection
    pgconn = driver.pgconn
    params = [None if q[k] is None else str(q[k]).encode() for k, _ in _REST_PARAMS]
    if driver.autocommit:
        loader = fairy.info.get(_REST_NAME)
        if loader is None:
            _check(pgconn.prepare(_REST_NAME, _REST.encode(), [oid for _, oid in _REST_PARAMS]))
            loader = fairy.info[_REST_NAME] = Transformer(driver)
        result = pgconn.exec_prepared(_REST_NAME, params)
    else:
        loader = Transformer(driver)
        result = pgconn.exec_params(_REST.encode(), params, [oid for _, oid in _REST_PARAMS])
    _check(result)
    loader.set_pgresult(result)
    return loader.load_row(0, tuple)


def _check(result) -> None:
    """psycopg's exception for a libpq result that failed (a timeout, a lost connection...)."""
    if result.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
        raise error_from_result(result)


def _at_rest(conn: Connection, q: dict, view: "LeaseView") -> tuple | None:
    """A round at rest (_REST): _ROUND's answer rebuilt from the caller's copy (its own leases, nothing
    freed, the replicas' rows with their fresh liveness and ages, no lease list), or None when
    anything changed (its heartbeat had aged out, a lease, a replica's row or liveness): the round
    then runs _ROUND."""
    beat, stamp, ids, live, ages, digests = _round_row(conn, q, _REST)
    if beat != 1 or stamp != view.stamp or ids is None or set(ids) != set(view.peers):
        return None
    if any(view.peers[rid][0] != digest for rid, digest in zip(ids, digests)):
        return None
    alive = {rid for rid, is_live in zip(ids, live) if is_live} | {q["me"]}
    if not view.holders <= alive:
        return None
    replicas = [[rid, is_live, *view.peers[rid][1], age] for rid, is_live, age in zip(ids, live, ages)]
    return beat, dict(view.kept), [], replicas, stamp, None


def run_round(conn: Connection, me: str, timing: Timing, switches=(), reachable=None,
              feed_lag: float | None = None, agents: dict[str, float] | None = None,
              switch_states: dict[str, list] | None = None, reaches: str | None = None,
              view: "LeaseView | None" = None, written: "Written | None" = None) -> Round:
    """One round of replica `me` on a session under `limit_session` (autocommit: each statement is
    its own transaction; or in the caller's transaction): lease rows made for new `switches`; then
    one statement: the heartbeat (with its change feed's lag, the agents it hears and what its
    switches say: see Round), which renews what it holds, and one view of the replicas and
    leases, from which it decides whether to take or give up leases toward its share (each one
    more statement; at rest neither, and the round is that one statement: _REST when what it
    sends and what it read last time are unchanged, else _ROUND). `reachable` (None:
    any): the switches it has an OpenFlow connection to (`reaches`: the same joined by commas, if
    the caller keeps it); it takes and renews only those, and gives up the others it holds.
    `view`: the caller's copy of the lease list, kept from round to round (see _ROUND). `written`:
    what the caller's rounds last wrote of its row (kept from round to round on one connection):
    `reaches`, `agents` and `switch_states` are sent only when they differ from it.
    ClusterError if its replica row is gone; LateHeartbeat if its heartbeat, revived, was stale
    again by the round's statement (more than a lease time between the two)."""
    switches = list(switches)
    if reachable is not None and reaches is None:
        reaches = ",".join(sorted(reachable))
    agents_json = json.dumps(agents) if agents else None
    states_json = json.dumps(switch_states) if switch_states else None
    p = {"me": me, "lease": timing.lease, "lag": feed_lag, "reaches": reaches,
         "agents": agents_json, "states": states_json}
    ensure_switches(conn, switches)
    view = view if view is not None else LeaseView()
    written = written if written is not None else Written()
    q = {**p, "keep": timing.keep, "stamp": view.stamp, "new_reaches": True, "new_agents": True, "new_states": True}
    if written.known:   # unchanged since the last round wrote them: the row keeps them (no new TOASTed value)
        q.update(new_reaches=reaches != written.reaches, new_agents=agents_json != written.agents,
                 new_states=states_json != written.states)
    # the slim statement only after a round that found the cluster at rest (after a change, the
    # full one at once: it would find the stamp changed)
    rest_round = (written.known and not (q["new_reaches"] or q["new_agents"] or q["new_states"] or switches)
                  and view.rest is not None and view.kept is not None)
    written.known = False     # until this round's statement wrote them
    got = _at_rest(conn, q, view) if rest_round else None
    last, view.last = view.last, None
    if got is not None and last is not None:
        replicas = got[3]
        if tuple((r[0], r[1]) for r in replicas if r[0] != me) == view.last_live:
            # what the last round found stands: only the other replicas' agents aged
            written.known = True
            view.last = last
            return replace(last, agents=_agents(replicas, me)) if any(last.agents.values()) else last
    if got is None:
        got = _full_round(conn, me, p, q, view)
    beat, kept, gone, replicas, stamp, rows = got
    written.known, written.reaches, written.agents, written.states = True, reaches, agents_json, states_json
    live = tuple((r[0], r[1]) for r in replicas if r[0] != me)
    cached = rows is None
    if cached:
        rows = view.rows
    else:   # kept only when every lease had a live holder (see _ROUND)
        view.stamp, view.rows = (stamp, rows) if all(h is not None for _, h, _, _ in rows) else (None, [])
        view.holders = frozenset(h for _, h, _, _ in view.rows)
        view.rest = None
    out = Round(held=kept, released=set(gone))
    # the view is as of the statement's start: this replica is live (its heartbeat was just written)
    replicas = [[r[0], True, *r[2:]] if r[0] == me else r for r in replicas]
    # at rest (the same leases, live replicas and reaches, and this replica's leases, as a round that
    # changed nothing) the decision is that round's: nothing to take or give up
    rest = (view.stamp, [(r[0], r[2]) for r in replicas if r[1]], dict(kept)) if cached and not gone else None
    if rest is not None and view.rest is not None and view.rest[0] == rest:
        holders, out.taken = view.rest[1], set(view.rest[2])
    else:
        holders = _decide(conn, me, timing, p, reachable, rows, replicas, out)
        if rest is not None and out.held == rest[2] and not out.released:
            view.rest = (rest, holders, frozenset(out.taken))
    for rid, is_live, _, address, openflow, _, states_json, _ in replicas:
        out.listeners[rid] = openflow
        if not is_live:
            continue
        out.openflow[rid], out.addresses[rid] = openflow, address
        if rid != me:
            states = json.loads(states_json) if states_json else {}
            out.reports.update((s, report) for s, report in states.items() if holders.get(s) == rid)
    out.agents = _agents(replicas, me)
    if rest is not None and view.rest is not None and view.rest[0] == rest:   # it changed nothing
        view.last, view.last_live = replace(out, same=True), live
    return out


def _agents(replicas: list, me: str) -> dict[str, dict[str, float]]:
    """The agents the other live replicas hear (Round.agents), their ages as of now: each row was
    written `age` seconds ago."""
    return {rid: {n: a + age for n, a in json.loads(agents_json).items()} if agents_json else {}
            for rid, is_live, _, _, _, agents_json, _, age in replicas if is_live and rid != me}


def _full_round(conn: Connection, me: str, p: dict, q: dict, view: LeaseView) -> tuple:
    """_ROUND's row (after reviving the heartbeat when it had aged out), the replicas' rows and the
    leases it holds kept in `view` for the next round at rest."""
    beat, kept, gone, replicas, stamp, rows = _round_row(conn, q)
    if beat != 1:
        if conn.execute(_REVIVE, p).first() is None:
            raise ClusterError(f"replica {me} is no longer registered in the cluster")
        q.update(new_reaches=True, new_agents=True, new_states=True)
        beat, kept, gone, replicas, stamp, rows = _round_row(conn, q)
        if beat != 1:
            raise LateHeartbeat(f"replica {me}: its heartbeat aged out again as soon as it was revived")
    view.peers = {r[0]: (r[8], r[2:7]) for r in replicas}
    view.kept = None if gone else dict(kept)
    return beat, kept, gone, [r[:8] for r in replicas], stamp, rows


def _decide(conn: Connection, me: str, timing: Timing, p: dict, reachable, rows: list, replicas: list,
            out: Round) -> dict[str, str]:
    """A round's takes and gives from its view (`rows`, `replicas`) into `out`; the leases' valid
    holders. The view is as of the statement's start: this replica holds what it renewed, and what it
    freed is free (it had a master until now)."""
    rows = [(s, me, None, False) if s in out.held else (s, None, -timing.lease, True) if s in out.released
            else (s, h, idle, freed) for s, h, idle, freed in rows]
    live = {r[0]: r for r in replicas if r[1]}
    holders = {s: h for s, h, _, _ in rows if h is not None}
    share = shares(list(live), len(rows))
    mine = len(out.held)
    counts = Counter(holders.values())

    def reached_by(r: str):
        """What live replica `r` reaches (None: any), as its heartbeat says."""
        s = live[r][2]
        return None if s is None else set(filter(None, s.split(",")))

    mine_to_reach = None if reachable is None else frozenset(reachable)
    unheld = [(s, idle, freed) for s, h, idle, freed in rows if h is None]        # free or expired
    free = [(s, idle, freed) for s, idle, freed in unheld if mine_to_reach is None or s in mine_to_reach]
    below = {r: share[r] - counts[r] for r in live if r != me and counts[r] < share[r]}
    below_reach = {r: reached_by(r) for r in below}
    taken: dict[str, int] = {}
    if free and mine < share.get(me, 0):
        # every lease whose holder's lease ran out (a failover is never paced), and at most
        # HANDOVER_BATCH of those freed (given up, or never held) while another replica is live: alone
        # (a cold start), no late round of its can cost it a lease, so it takes them all
        batch = HANDOVER_BATCH if len(live) > 1 else None
        candidates = ([s for s, _, freed in free if not freed]
                      + [s for s, _, freed in free if freed][:batch])
        taken.update(conn.execute(_TAKE, {**p, "candidates": candidates, "n": share[me] - mine}).all())
    if reachable is not None and mine + len(taken) >= share.get(me, 0):
        # beyond its share: a switch it reaches that no live replica below its share reaches, and that
        # has had no master for a lease time (while it is below its share itself, what it reaches is
        # its own to take, a batch a round)
        orphans = [s for s, idle, _ in free if s not in taken and idle >= 0
                   and not any(rs is None or s in rs for rs in below_reach.values())]
        if orphans:
            taken.update(conn.execute(_TAKE, {**p, "candidates": orphans, "n": len(orphans)}).all())
    out.held.update(taken)
    mine = len(out.held)
    if mine > share.get(me, 0) and below:
        # given up only toward a live replica below its share that reaches the switch, and no more than
        # those replicas still lack once they took the free leases they reach
        pending = sum(1 for s, _, _ in unheld if s not in taken
                      and any(rs is None or s in rs for rs in below_reach.values()))
        room = sum(below.values()) - pending
        givable = [s for s in sorted(out.held) if any(rs is None or s in rs for rs in below_reach.values())]
        give = givable[:min(mine - share[me], room)]
        if give:
            conn.execute(_GIVE, {**p, "give": give})
            for switch in give:
                del out.held[switch]
            out.released.update(give)
    out.taken = (set(holders) | set(out.held)) - out.released
    return holders


# The sessions of replicas whose heartbeat is older than the keep time (paused, hung, or whose rounds
# fail), opened before then and named as a replica names them (its pool's, its rounds' and its change
# feed's: fathom.store.db.connect_args, fathom.cluster.feed), ended; the ids of those replicas, once
# each, and the share of PostgreSQL's notification queue in use. Such a process's kernel still answers
# TCP keepalives, so PostgreSQL keeps its sessions: one in a transaction keeps its row locks, and its
# change feed's LISTEN session, which its client no longer reads, blocks on its socket and holds the
# notification queue (8 GB at most) at its place, so the queue grows with every write of the cluster
# until NOTIFY, and with it every write, fails. A replica that comes back revives its heartbeat and
# connects again (its change feed then reads the whole store). The candidates are fixed
# (MATERIALIZED) before any is ended.
_END_STALE = text(
    "WITH stale AS MATERIALIZED ("
    "  SELECT a.pid, r.id FROM pg_stat_activity a JOIN cluster_replicas r "
    "  ON a.application_name IN ('fathom controller ' || r.id, 'fathom leases ' || r.id, 'fathom feed ' || r.id) "
    "  WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() "
    "  AND r.heartbeat <= clock_timestamp() - make_interval(secs => :keep) "
    "  AND a.backend_start <= clock_timestamp() - make_interval(secs => :keep)) "
    "SELECT (SELECT coalesce(json_agg(DISTINCT id), '[]') FROM stale WHERE pg_terminate_backend(pid)), "
    "       pg_notification_queue_usage()")


def end_stale_sessions(conn: Connection, timing: Timing) -> tuple[list[str], float]:
    """End the sessions of the replicas whose heartbeat is older than `timing.keep` (_END_STALE): the
    ids of those whose sessions were ended, and the share of PostgreSQL's notification queue in use."""
    ended, usage = conn.execute(_END_STALE, {"keep": timing.keep}).one()
    return sorted(ended), float(usage)


def leave(conn: Connection, me: str) -> list[str]:
    """Give up every lease of `me` (the others take them at their next round) and unregister it."""
    gone = [s for (s,) in conn.execute(text("UPDATE cluster_leases SET holder = NULL, renewed = clock_timestamp() "
                                            "WHERE holder = :me RETURNING switch"), {"me": me})]
    conn.execute(text("DELETE FROM cluster_replicas WHERE id = :me"), {"me": me})
    return gone


def status(conn: Connection, timing: Timing) -> dict:
    """The replicas and leases as PostgreSQL sees them now: ages and remaining times in seconds by its
    clock."""
    p = {"lease": timing.lease}
    replicas = [
        {"id": r.id, "address": r.address, "openflow": r.openflow, "live": r.live, "started": r.started.isoformat(),
         "feed_lag": None if r.feed_lag is None else round(r.feed_lag, 4),
         "heartbeat_age": round(r.age, 3), "schema_version": r.schema_version, "pki_fingerprint": r.pki_fingerprint,
         "switches": 0}
        for r in conn.execute(text(
            f"SELECT id, address, openflow, feed_lag, started, schema_version, pki_fingerprint, {_LIVE} AS live, "
            f"extract(epoch FROM clock_timestamp() - heartbeat)::float AS age FROM cluster_replicas ORDER BY id"), p)]
    by_id = {r["id"]: r for r in replicas}
    leases = []
    for row in conn.execute(text(
            "SELECT l.switch, l.holder, l.epoch, r.heartbeat > clock_timestamp() - make_interval(secs => :lease) "
            "AS valid, extract(epoch FROM r.heartbeat + make_interval(secs => :lease) - clock_timestamp())::float "
            "AS left, extract(epoch FROM clock_timestamp() - coalesce(r.heartbeat, l.renewed))::float AS renewed_age "
            "FROM cluster_leases l LEFT JOIN cluster_replicas r ON r.id = l.holder ORDER BY l.switch"), p):
        holder = row.holder if row.valid else None
        if holder in by_id:
            by_id[holder]["switches"] += 1
        leases.append({"switch": row.switch, "holder": holder, "epoch": row.epoch,
                       "expires_in": round(row.left, 3) if row.valid else None,
                       "renewed_age": round(row.renewed_age, 3) if row.renewed_age is not None else None})
    usage = conn.execute(text("SELECT pg_notification_queue_usage()")).scalar_one()
    return {"timing": {"renew": timing.renew, "lease": timing.lease, "guard": timing.guard},
            "replicas": replicas, "leases": leases, "notify_queue_usage": float(usage)}
