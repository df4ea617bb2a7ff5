"""Writing statuses: the controller decides them (fathom.controller.status), the store writes them.

Writing a status does not change any desired state, so it must not wake the reconciler. Only
changed rows are touched; objects deleted since the pass's snapshot are skipped.
"""
from __future__ import annotations

import functools
from typing import Mapping, Sequence

from sqlalchemy import bindparam, or_, select, update
from sqlalchemy.orm import Session

from fathom.store import models as m
from fathom.store.db import NeedsTransaction, at_once, run_prepared
from fathom.store.agent_models import PptmonAttachment
from fathom.store import sfc_models as sm
from fathom.store.external_models import FloatingIp
from fathom.store.fabric_models import FabricSwitch

MODELS = {
    "node": m.Node, "network": m.Network, "subnet": m.Subnet, "port": m.Port, "router": m.Router,
    "router_interface": m.Port,   # a router interface is a port of the router
    "tap_policy": m.TapPolicy, "fabric_switch": FabricSwitch, "pptmon_attachment": PptmonAttachment,
    "security_group": m.SecurityGroup, "floating_ip": FloatingIp,
    "port_chain": sm.PortChain, "port_pair": sm.PortPair, "port_pair_group": sm.PortPairGroup,
    "flow_classifier": sm.FlowClassifier,
}


# Not an object's status but a list per subnet: ("subnet_dhcp", subnet id) -> ((node, status,
# reason), ...), the DHCP servers of the subnet's network on each node (fathom.controller.status),
# kept in the subnet's `dhcp_status` column.
DHCP = "subnet_dhcp"


def dhcp_status_value(rows) -> tuple:
    """The stored `dhcp_status` JSON as the controller's value: ((node, status, reason), ...)."""
    return tuple((r["node"], r["status"], r.get("reason")) for r in rows or ())


def set_status(session: Session, kind: str, object_id: int, status: str, reason: str | None = None) -> bool:
    """Set one object's status ("pending", "active", "error") and reason; False if it is gone."""
    if status not in m.STATUSES:
        raise ValueError(f"status {status!r} is not one of {m.STATUSES}")
    obj = session.get(MODELS[kind], object_id)
    if obj is None:
        return False
    if obj.status != status or obj.status_reason != reason:
        obj.status, obj.status_reason = status, reason
    return True


STATUS_LOCK_WAIT = 2.0    # seconds (see write_statuses)


def write_statuses(session: Session, statuses: Mapping[tuple[str, int], tuple[str, str | None]],
                   node_states: Mapping[str, str] = {}, notes: Sequence[tuple[str, str]] = ()) -> None:
    """(kind, id) -> (status, reason) for many objects, and node name -> bootstrap state, in the
    caller's transaction. On PostgreSQL it waits at most STATUS_LOCK_WAIT for a row another
    transaction holds (OperationalError after): a reconciler's pass writes them, and a pass held
    behind the row locks of a stopped peer's open transaction (a paused replica, until PostgreSQL
    ends it) would hold every switch's changes with it; the failed pass is run again. `notes`:
    notifications (channel, payload) the transaction sends as it commits (a notification is
    delivered at the commit wherever in the transaction it was made).

    On PostgreSQL the lock wait, the notes and the objects' statuses are one statement
    (`_statuses_sql`), which is all a write of objects' statuses alone sends: it may run without a
    transaction (db.AT_ONCE, as the reconciler runs it when `at_once_writes` says so)."""
    by_kind: dict[str, dict[int, tuple]] = {}
    for (kind, object_id), value in statuses.items():
        by_kind.setdefault(kind, {})[object_id] = value
    dhcp = by_kind.pop(DHCP, {})
    if session.get_bind().dialect.name == "postgresql":
        if at_once(session) and (dhcp or node_states):
            raise NeedsTransaction("subnets' DHCP statuses and nodes' states are written in a transaction")
        by_table: dict[str, dict[int, tuple]] = {}
        for kind, values in by_kind.items():     # a later kind's status of a row wins, as it did by kind
            by_table.setdefault(MODELS[kind].__tablename__, {}).update(values)
        params = {"wait": f"{int(STATUS_LOCK_WAIT * 1000)}ms", "channels": [c for c, _ in notes],
                  "payloads": [p for _, p in notes]}
        for i, values in enumerate(by_table[t] for t in sorted(by_table)):
            params.update({f"ids{i}": list(values), f"statuses{i}": [st for st, _ in values.values()],
                           f"reasons{i}": [reason for _, reason in values.values()]})
        run_prepared(session.connection(), _statuses_sql(tuple(sorted(by_table))), params)
    elif notes:
        raise ValueError("notifications need PostgreSQL")
    else:
        for kind, values in by_kind.items():
            session.connection().execute(
                _status_update(MODELS[kind].__table__),
                [{"row": i, "new_status": st, "new_reason": reason} for i, (st, reason) in values.items()])
    for subnet_id, value in dhcp.items():
        subnet = session.get(m.Subnet, subnet_id)
        if subnet is not None and dhcp_status_value(subnet.dhcp_status) != tuple(value):
            subnet.dhcp_status = [{"node": n, "status": st, "reason": r} for n, st, r in value]
    if node_states:
        for node in session.scalars(select(m.Node).where(m.Node.name.in_(list(node_states)))):
            if node.state != node_states[node.name]:
                node.state = node_states[node.name]


def at_once_writes(statuses: Mapping, node_states: Mapping) -> bool:
    """Whether write_statuses writes these with one statement on PostgreSQL (no transaction needed)."""
    return not node_states and not any(kind == DHCP for kind, _ in statuses)


@functools.cache
def _statuses_sql(tables: tuple[str, ...]) -> str:
    """write_statuses's statement on PostgreSQL, run prepared on the driver (db.run_prepared): the
    lock wait set and the notes sent first (`settings`: the query reads it, and each UPDATE joins
    it, so no row is updated, nor waited for, before; with notes it takes a transaction id, so that
    a transaction that sent them is rolled back as one that wrote: fathom.store.db), then for each
    table (its index i) the rows `ids<i>` given `statuses<i>` and `reasons<i>` (arrays), each row
    whose status or reason differs (a row deleted meanwhile is not there)."""
    updates = "".join(
        f", u{i} AS (UPDATE {table} AS t SET status = v.status, status_reason = v.reason FROM settings, "
        f"unnest(%(ids{i})s::integer[], %(statuses{i})s::text[], %(reasons{i})s::text[]) AS v(id, status, reason) "
        "WHERE t.id = v.id AND (t.status IS DISTINCT FROM v.status OR t.status_reason IS DISTINCT FROM v.reason))"
        for i, table in enumerate(tables))
    return ("WITH settings AS MATERIALIZED (SELECT set_config('lock_timeout', %(wait)s, true) AS wait, "
            "(SELECT count(pg_notify(n.channel, n.payload)) FROM unnest(%(channels)s::text[], %(payloads)s::text[]) "
            "AS n(channel, payload)) AS notified, "
            "CASE WHEN cardinality(%(channels)s::text[]) > 0 THEN pg_current_xact_id() END AS xid)"
            f"{updates} SELECT wait, notified, xid FROM settings")


@functools.cache
def _status_update(table):
    """One UPDATE of a table's statuses (SQLite), run for every row (executemany): it leaves alone a
    row whose status and reason are already these (and a row deleted meanwhile: it is not there)."""
    return (update(table).where(table.c.id == bindparam("row"))
            .where(or_(table.c.status.is_distinct_from(bindparam("new_status")),
                       table.c.status_reason.is_distinct_from(bindparam("new_reason"))))
            .values(status=bindparam("new_status"), status_reason=bindparam("new_reason"))
            .execution_options(model_unchanged=True))   # statuses are not in the model


def set_node_state(session: Session, node_id: int, state: str, reason: str | None = None) -> bool:
    """Bootstrap state of a node (init, device_created, complete, error). `error` also sets the
    node's status to error with `reason`; `complete` makes it active; others leave it pending."""
    if state not in m.NODE_STATES:
        raise ValueError(f"node state {state!r} is not one of {m.NODE_STATES}")
    node = session.get(m.Node, node_id)
    if node is None:
        return False
    node.state = state
    node.status = {"error": "error", "complete": "active"}.get(state, "pending")
    node.status_reason = reason
    return True
