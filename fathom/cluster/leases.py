"""Replicas and switch leases in PostgreSQL: the statements, each round one transaction.

Every time is PostgreSQL's clock (`clock_timestamp()`, the real time inside a transaction), never a
replica's: a replica whose clock is wrong or jumps changes nothing. A replica is live while its
heartbeat is younger than the lease time. A switch's lease row is never deleted, so its epoch never
goes back; the epoch grows by one each time the lease is taken, and it is the OpenFlow generation_id
of the holder's master role request (fathom.controller.switch): a switch refuses a request with an
older one (OFPRRFC_STALE), and a newer master demotes the older to slave (OFPBRC_IS_SLAVE on its
writes).

One switch never has two holders: a lease is taken only from rows locked with `FOR UPDATE SKIP
LOCKED` whose lease is free or expired when locked (PostgreSQL re-reads a row changed meanwhile), and
renewed only by its holder while unexpired.

Balance: the live replicas, ordered by id, have fair shares of the switches that differ by one at
most (the first `switches % replicas` take one more). In each round a replica takes free or expired
leases up to its share, and gives up what it holds above its share only while a live replica is
below its own (so only to a taker); with a stable membership that is a fixed point: nothing moves.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Connection, Engine, inspect, text


class ClusterError(Exception):
    """This process cannot be a replica of the cluster; the message says why and what to do."""


@dataclass(frozen=True)
class Timing:
    """`renew`: seconds between a replica's rounds (heartbeat, renewal, balance); `lease`: how long a
    lease and a heartbeat last after the round that wrote them (PostgreSQL's clock); `guard`: how much
    before its lease's end, counted on its monotonic clock from when it sent the round, a holder stops
    acting as master."""
    renew: float = 0.25
    lease: float = 1.0
    guard: float = 0.1

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


_SECONDS = "make_interval(secs => :lease)"
_LIVE = f"heartbeat > clock_timestamp() - {_SECONDS}"


def join(conn: Connection, me: str, address: str, schema_version: str, fingerprint: str, timing: Timing,
         openflow: str = "") -> None:
    """Register replica `me`, or refuse it (ClusterError) when a live replica runs another schema
    version or PKI. Joins queue on one transaction lock, so two replicas cannot both be first."""
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
        "INSERT INTO cluster_replicas (id, address, started, heartbeat, schema_version, pki_fingerprint, openflow) "
        "VALUES (:me, :address, clock_timestamp(), clock_timestamp(), :schema, :fp, :openflow)"),
        {"me": me, "address": address, "schema": schema_version, "fp": fingerprint, "openflow": openflow})


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
    rows = [{"switch": s} for s in switches]
    if rows:
        conn.execute(text("INSERT INTO cluster_leases (switch, epoch) VALUES (:switch, 0) ON CONFLICT DO NOTHING"), rows)


@dataclass
class Round:
    """What one round found and did: `held` the leases this replica holds after it (switch -> epoch),
    `released` the switches it gave up in it, `taken` every switch with a valid lease (any holder),
    `openflow` the live replicas' OpenFlow listeners (id -> host:port), `addresses` their APIs
    (id -> URL). From the other live replicas' heartbeats: `agents`, the nodes whose agents each
    hears (id -> node -> seconds since it heard the agent, as of this round), and `reports`, what a
    switch's master says of it when not simply `ok` (switch -> [state, [[cookie kind, object id,
    why refused], ...]]), from its lease's holder only."""
    held: dict[str, int] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)
    taken: set[str] = field(default_factory=set)
    openflow: dict[str, str] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    agents: dict[str, dict[str, float]] = field(default_factory=dict)
    reports: dict[str, list] = field(default_factory=dict)


def shares(replicas: list[str], switches: int) -> dict[str, int]:
    """Each live replica's fair share: replicas ordered by id, the first `switches % n` one more."""
    n = len(replicas)
    return {r: switches // n + (1 if i < switches % n else 0) for i, r in enumerate(sorted(replicas))} if n else {}


def run_round(conn: Connection, me: str, timing: Timing, switches=(), reachable=None,
              feed_lag: float | None = None, agents: dict[str, float] | None = None,
              switch_states: dict[str, list] | None = None) -> Round:
    """One round of replica `me`, in the caller's transaction: lease rows made for new `switches`,
    heartbeat (with its change feed's lag, the agents it hears and what its switches say: see
    Round), renew what it still holds, then take or give up leases toward its share. `reachable`
    (None: any): the switches it has an OpenFlow connection to; it takes and renews only those, and
    gives up the others it holds. ClusterError if its replica row is gone."""
    p = {"me": me, "lease": timing.lease, "lag": feed_lag,
         "reaches": None if reachable is None else ",".join(sorted(reachable)),
         "agents": json.dumps(agents) if agents else None,
         "states": json.dumps(switch_states) if switch_states else None}
    # a round that cannot finish within the lease time (locks held, a stalled server) fails instead of
    # waiting: the leases end at the holder's deadline either way, and the failure is counted; and a
    # round whose replica stops mid-way (paused) has its session ended after the lease time, so the
    # lease rows it locked are free to be taken (SKIP LOCKED would pass over them for as long)
    ms = int(timing.lease * 1000)
    conn.execute(text(f"SET LOCAL statement_timeout = {ms}"))
    conn.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {ms}"))
    ensure_switches(conn, switches)
    if conn.execute(text("UPDATE cluster_replicas SET heartbeat = clock_timestamp(), feed_lag = :lag, "
                            "reaches = :reaches, agents = :agents, switch_states = :states WHERE id = :me"),
                    p).rowcount != 1:
        raise ClusterError(f"replica {me} is no longer registered in the cluster")
    out = Round()
    if reachable is not None:     # a switch it lost its connection to: its lease goes to one that reaches it
        p["reachable"] = sorted(reachable)
        out.released.update(s for (s,) in conn.execute(text(
            "UPDATE cluster_leases SET holder = NULL, expires = NULL WHERE holder = :me "
            "AND NOT (switch = ANY(:reachable)) RETURNING switch"), p))
    only_reachable = "" if reachable is None else "AND switch = ANY(:reachable) "
    out.held = dict(conn.execute(text(
        f"UPDATE cluster_leases SET expires = clock_timestamp() + {_SECONDS}, renewed = clock_timestamp() "
        f"WHERE holder = :me AND expires > clock_timestamp() RETURNING switch, epoch"), p).all())
    reaches = {r: None if s is None else set(filter(None, s.split(",")))
               for r, s in conn.execute(text(f"SELECT id, reaches FROM cluster_replicas WHERE {_LIVE}"), p)}
    live = list(reaches)
    total = conn.execute(text("SELECT count(*) FROM cluster_leases")).scalar_one()
    held = dict(conn.execute(text("SELECT holder, count(*) FROM cluster_leases WHERE holder IS NOT NULL "
                                  "AND expires > clock_timestamp() GROUP BY holder")).all())
    share = shares(live, total)
    mine = len(out.held)
    if mine < share.get(me, 0):
        got = conn.execute(text(
            f"UPDATE cluster_leases AS l SET holder = :me, epoch = l.epoch + 1, "
            f"expires = clock_timestamp() + {_SECONDS}, renewed = clock_timestamp() "
            f"FROM (SELECT switch FROM cluster_leases WHERE (holder IS NULL OR expires <= clock_timestamp()) "
            f"      {only_reachable}ORDER BY expires NULLS FIRST, switch LIMIT :n FOR UPDATE SKIP LOCKED) AS free "
            f"WHERE l.switch = free.switch RETURNING l.switch, l.epoch"), {**p, "n": share[me] - mine}).all()
        out.held.update(dict(got))
    if reachable is not None:
        # beyond its share: a switch it reaches that has had no master for a lease time (no replica
        # below its share took it meanwhile: none reaches it)
        got = conn.execute(text(
            f"UPDATE cluster_leases AS l SET holder = :me, epoch = l.epoch + 1, "
            f"expires = clock_timestamp() + {_SECONDS}, renewed = clock_timestamp() "
            f"FROM (SELECT switch FROM cluster_leases WHERE (holder IS NULL OR expires <= clock_timestamp()) "
            f"      AND (renewed IS NULL OR renewed < clock_timestamp() - {_SECONDS}) {only_reachable}"
            f"      FOR UPDATE SKIP LOCKED) AS free "
            f"WHERE l.switch = free.switch RETURNING l.switch, l.epoch"), p).all()
        out.held.update(dict(got))
        mine = len(out.held)
    if mine > share.get(me, 0):
        # given up only toward a live replica below its share that reaches the switch
        wanting = {r: s - held.get(r, 0) for r, s in share.items() if r != me and s > held.get(r, 0)}
        givable = [s for s in sorted(out.held) if any(reaches[r] is None or s in reaches[r] for r in wanting)]
        give = givable[:min(mine - share.get(me, 0), sum(wanting.values()))]
        if give:
            conn.execute(text("UPDATE cluster_leases SET holder = NULL, expires = NULL "
                              "WHERE holder = :me AND switch = ANY(:give)"), {**p, "give": give})
            for switch in give:
                del out.held[switch]
            out.released.update(give)
    holders = dict(conn.execute(text(
        "SELECT switch, holder FROM cluster_leases WHERE holder IS NOT NULL AND expires > clock_timestamp()")).all())
    out.taken = set(holders)
    for r in conn.execute(text(f"SELECT id, address, openflow, agents, switch_states, "
                               f"extract(epoch FROM clock_timestamp() - heartbeat)::float AS age "
                               f"FROM cluster_replicas WHERE {_LIVE}"), p):
        out.openflow[r.id], out.addresses[r.id] = r.openflow, r.address
        if r.id != me:   # ages as of now: the row was written `age` seconds ago
            out.agents[r.id] = {n: a + r.age for n, a in (json.loads(r.agents) if r.agents else {}).items()}
            states = json.loads(r.switch_states) if r.switch_states else {}
            out.reports.update((s, report) for s, report in states.items() if holders.get(s) == r.id)
    return out


def leave(conn: Connection, me: str) -> list[str]:
    """Give up every lease of `me` (the others take them at their next round) and unregister it."""
    gone = [s for (s,) in conn.execute(text("UPDATE cluster_leases SET holder = NULL, expires = NULL "
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
            "SELECT switch, holder, epoch, expires > clock_timestamp() AS valid, "
            "extract(epoch FROM expires - clock_timestamp())::float AS left, "
            "extract(epoch FROM clock_timestamp() - renewed)::float AS renewed_age FROM cluster_leases ORDER BY switch")):
        holder = row.holder if row.valid else None
        if holder in by_id:
            by_id[holder]["switches"] += 1
        leases.append({"switch": row.switch, "holder": holder, "epoch": row.epoch,
                       "expires_in": round(row.left, 3) if row.valid else None,
                       "renewed_age": round(row.renewed_age, 3) if row.renewed_age is not None else None})
    return {"timing": {"renew": timing.renew, "lease": timing.lease, "guard": timing.guard},
            "replicas": replicas, "leases": leases}
