"""Which tables committed writes touched since the controller last asked (`TableChanges.take`), so
it re-reads only those parts of the store (fathom.store.snapshot.StoreReader) after an API write.

Every INSERT, UPDATE and DELETE an engine runs is noted per connection and counted once its
transaction commits (a rolled-back write counts for nothing). A DELETE also counts for the tables
whose foreign keys cascade from it (ON DELETE CASCADE / SET NULL, transitively); a statement whose
table cannot be told (raw SQL) counts for every table (`ALL`). Statements run with the execution
option `model_unchanged=True` (the reconciler's own status writes: statuses are not part of the
model; an agent's desired-state revision) are not counted. Writes by another process (another
replica, an API worker) are counted when the change feed tells them (`written_elsewhere`,
fathom.cluster.feed), by every tracker of the engine, as if this process had made them, but kept
apart (`take_apart`): they were committed when counted, this process's own were about to be.

Writes to a port's own rows (the port, its addresses, its security group memberships) are noted
by row, so the ports part is patched rather than read whole (`StoreReader`): `("port", id)` for a
port whose rows changed, or that was inserted and told (`port_inserted`: the ORM's, and
fathom.store.ops.insert_port's; its id is told once the row is; `("port",
None)`: a transaction inserted a port another way too, and the reader looks for the new ids),
`("ip_allocation", id)` for an address row named only by its id (the reader knows its port), and
`("port_cascade", table)` for a table a port delete cascades to, which counts as `table` for
every part but the ports part (its rows there are the port's own, or a column it does not read:
see PORT_ROWS). A write to those tables that cannot be told by row (a WHERE without an equality
on a key column, an INSERT without the port, raw SQL) counts as its table, as before.

A workload port's write through the API (created, updated, deleted: fathom.store.ops) also notes
where it is (`port_written`): `("port_at", (port id, its node's id before, after, its network's
id))`, a node None where it is unbound. Nothing reads it to read the store; it tells the change
feed's receivers which switches the write may touch (fathom.controller.cluster.ClusterMember.wakes_for).
"""
from __future__ import annotations

import re
import threading
import weakref

from sqlalchemy import Engine, event
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import BindParameter, BinaryExpression, BooleanClauseList

ALL = "*"
_DML = re.compile(r"\s*(insert|update|delete|replace|merge|truncate)\b", re.IGNORECASE)
_WHERE = re.compile(r"\bwhere\b", re.IGNORECASE)
# The tables noted by row: table -> (its key columns usable in a WHERE -> the token kind they name).
PORT_ROWS = {
    "ports": {"id": "port"},
    "ip_allocations": {"id": "ip_allocation", "port_id": "port"},
    "port_security_groups": {"port_id": "port"},
}


def _cascades() -> dict[str, set[str]]:
    """table -> the tables a DELETE of its rows may change through foreign keys (transitively)."""
    from fathom.store.tables import metadata
    direct: dict[str, set[str]] = {}
    for table in metadata.tables.values():
        for fk in table.foreign_keys:
            if (fk.ondelete or "").upper() in ("CASCADE", "SET NULL"):
                direct.setdefault(fk.column.table.name, set()).add(table.name)
    out = {}
    for name in direct:
        seen, todo = set(), [name]
        while todo:
            for t in direct.get(todo.pop(), ()):
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        out[name] = seen
    return out


_PENDING = "fathom_written_"    # conn.info keys of the trackers' uncommitted writes: this, then the tracker's id
_TOLD = "port told"             # (_TOLD, id): a port inserted and told, until the commit compares the counts


def port_inserted(connection, port_id: int) -> None:
    """A port's row was inserted on `connection` (by the ORM, or by fathom.store.ops.insert_port): its
    id, for every tracker that saw a port INSERT on this connection."""
    for key, pending in connection.info.items():
        if isinstance(key, str) and key.startswith(_PENDING) and ("port", None) in pending:
            pending.add((_TOLD, port_id))


def port_rows_written(connection, port_id: int, told: "TableChanges | None" = None) -> None:
    """A statement the trackers cannot read (fathom.store.ops.insert_port's, with data-modifying
    CTEs) wrote a port's rows on `connection`: noted by every tracker of its engine as its own
    statements would have been, as ("port", id); but `told`, whose notice the statement wrote
    (notice_in_statement)."""
    with _TRACKERS_LOCK:
        trackers = list(_TRACKERS.get(connection.engine.pool, ()))
    for tracker in trackers:
        if tracker is not told and tracker._noted(connection.get_execution_options()):
            connection.info.setdefault(tracker._pending, set()).add(("port", port_id))
            if not connection.in_transaction():
                tracker._committed(connection)


def port_at(port_id: int, node_before: int | None, node_after: int | None, network_id: int) -> tuple:
    """The token that says where a written port is (see the module's docstring)."""
    return ("port_at", (port_id, node_before, node_after, network_id))


def port_written(connection, port_id: int, node_before: int | None, node_after: int | None,
                 network_id: int) -> None:
    """A workload port's rows were written in `connection`'s transaction: where it is, noted by every
    tracker of its engine (`port_at`)."""
    with _TRACKERS_LOCK:
        trackers = list(_TRACKERS.get(connection.engine.pool, ()))
    for tracker in trackers:
        if tracker._noted(connection.get_execution_options()):
            connection.info.setdefault(tracker._pending, set()).add(
                port_at(port_id, node_before, node_after, network_id))


def _port_told(_mapper, connection, target) -> None:
    port_inserted(connection, target.id)


# an engine's pool -> its trackers (a WeakSet). By pool, not engine: `engine.execution_options()`
# makes another Engine object over the same pool and connections (a replica's lease rounds and its
# change feed use one), and a write told through it is the same database's.
_TRACKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TRACKERS_LOCK = threading.Lock()


def notice_in_statement(connection) -> "TableChanges | None":
    """The tracker of `connection`'s engine that writes in each committing transaction
    (IN_TRANSACTION: fathom.cluster.feed's notices), None without one. A statement that commits on
    its own (fathom.store.db.AT_ONCE) writes that tracker's notice itself (its `notice`, told back
    with `noticed` and port_rows_written's `told`): there is no commit to write it at."""
    options = connection.get_execution_options()
    with _TRACKERS_LOCK:
        return next((t for t in _TRACKERS.get(connection.engine.pool, ()) if t.IN_TRANSACTION and t._noted(options)),
                    None)


def written_elsewhere(engine: Engine, written: set) -> None:
    """Another process committed writes of these tables and row tokens (fathom.cluster.feed): every
    tracker of `engine` (or of an engine over the same pool) counts them as committed here."""
    with _TRACKERS_LOCK:
        trackers = list(_TRACKERS.get(engine.pool, ()))
    for tracker in trackers:
        tracker._count(written, elsewhere=True)


class TableChanges:
    """The tables an engine wrote since the last `take()` (one reader per tracker)."""
    IN_TRANSACTION = False      # notice_in_statement

    def __init__(self, engine: Engine):
        from fathom.store.models import Port
        self._lock = threading.Lock()
        self._written: set = set()
        self._elsewhere: set = set()     # and those another process committed (see take_apart)
        # a connection's writes not yet committed, and the ports rows its INSERTs wrote at most,
        # under keys of this tracker's own (an engine may have several: the reconciler's, the
        # agents' desired state)
        self._pending = f"{_PENDING}{id(self)}"
        self._inserted = f"fathom_ports_inserted_{id(self)}"
        self._cascade = _cascades()
        event.listen(engine, "after_cursor_execute", self._executed)
        event.listen(engine, "commit", self._committed)
        event.listen(engine, "rollback", self._rolled_back)
        if not event.contains(Port, "after_insert", _port_told):
            event.listen(Port, "after_insert", _port_told)
        with _TRACKERS_LOCK:
            _TRACKERS.setdefault(engine.pool, weakref.WeakSet()).add(self)

    def take(self) -> set:
        """The tables (and port row tokens) written by the transactions committed since the last call."""
        return set().union(*self.take_apart())

    def take_apart(self) -> tuple[set, set]:
        """`take`, in two: what this process's commits wrote, counted as they were about to commit
        (a read that starts at once may not see them yet), and what the change feed told, counted
        once committed (a read that starts after it sees them)."""
        with self._lock:
            out, self._written = self._written, set()
            elsewhere, self._elsewhere = self._elsewhere, set()
        return out, elsewhere

    def _noted(self, options) -> bool:
        """Whether a statement run with these execution options counts."""
        return not options.get("model_unchanged")

    def _executed(self, conn, _cursor, statement, _parameters, context, _executemany) -> None:
        if context is None or not self._noted(context.execution_options):
            return
        if not (context.isinsert or context.isupdate or context.isdelete):
            if _DML.match(statement or ""):
                conn.info.setdefault(self._pending, set()).add(ALL)
                if not conn.in_transaction():
                    self._committed(conn)
            return
        table = getattr(getattr(context.compiled, "statement", None), "table", None)
        name = getattr(table, "name", None)
        rows = _port_rows(context, table) if name in PORT_ROWS else None
        if rows == {("port", None)}:
            conn.info[self._inserted] = conn.info.get(self._inserted, 0) + _rows_at_most(context)
        names = rows or ({name} if name else {ALL})
        if context.isdelete and name:
            cascaded = self._cascade.get(name, set())
            names |= {("port_cascade", t) for t in cascaded} if rows and name == "ports" else cascaded
        conn.info.setdefault(self._pending, set()).update(names)
        if not conn.in_transaction():   # autocommit: there will be no commit event
            self._committed(conn)

    def _committed(self, conn) -> None:
        written = conn.info.pop(self._pending, None)
        inserted = conn.info.pop(self._inserted, 0)
        if written:
            told = {t for t in written if isinstance(t, tuple) and t[0] == _TOLD}
            written -= told
            if told and len(told) == inserted:   # every port inserted was told: none to look for
                written.discard(("port", None))
                written |= {("port", i) for _, i in told}
            self._committed_on(conn, written)

    def _committed_on(self, _conn, written: set) -> None:
        """A transaction of `_conn` is committing these writes (before the database's commit)."""
        self._count(written)

    def _count(self, written: set, elsewhere: bool = False) -> None:
        with self._lock:
            if elsewhere:
                self._elsewhere |= written
            else:
                self._written |= written

    def _rolled_back(self, conn) -> None:
        if conn.invalidated:    # its DBAPI connection is gone (the server ended it), and its info with it
            return
        conn.info.pop(self._pending, None)
        conn.info.pop(self._inserted, None)


def _rows_at_most(context) -> float:
    """How many rows an INSERT wrote at most: one per parameter set, or any number (INSERT … SELECT,
    several rows' values in one statement). Never fewer, so a count that the ORM's told ids match
    means no other row was inserted."""
    if not _rows_per_parameter_set(context.compiled.statement):
        return float("inf")
    return len(context.compiled_parameters or ()) or 1


def _rows_per_parameter_set(statement) -> bool:
    """Whether an INSERT writes one row per parameter set (not INSERT … SELECT, nor several rows'
    values in one statement)."""
    return getattr(statement, "select", None) is None and not getattr(statement, "_multi_values", ())


def _port_rows(context, table) -> set | None:
    """The row tokens of a write to one of PORT_ROWS' tables, or None when it cannot be told."""
    compiled, name = context.compiled, table.name
    params = context.compiled_parameters or []
    if context.isinsert:
        if name == "ports":
            return {("port", None)}
        if not _rows_per_parameter_set(compiled.statement):
            return None             # INSERT … SELECT, or several rows' values under other names
        ids = [p.get("port_id") for p in params]
        if not ids or None in ids:
            return None
        return {("port", i) for i in ids}
    if context.isupdate and name != "ports":
        # the new port of a moved row is not known from the WHERE
        if "port_id" in _WHERE.split(context.statement or "", 1)[0].lower():
            return None
    key = _where_key(compiled, table, PORT_ROWS[name])
    if key is None:
        return None
    kind, bind_name = key
    values = [p.get(bind_name) for p in params]
    if not values or None in values:
        return None
    return {(kind, v) for v in values}


def _where_key(compiled, table, keys: dict[str, str]) -> tuple[str, str] | None:
    """(token kind, bound parameter name) of an equality on a key column ANDed into the WHERE."""
    where = getattr(compiled.statement, "whereclause", None)
    if where is None:
        return None
    terms = where.clauses if isinstance(where, BooleanClauseList) and where.operator is operators.and_ else [where]
    for term in terms:
        if not (isinstance(term, BinaryExpression) and term.operator is operators.eq):
            continue
        col, bind = term.left, term.right
        if (getattr(getattr(col, "table", None), "name", None) == table.name and col.name in keys
                and isinstance(bind, BindParameter) and not bind.expanding):
            bind_name = compiled.bind_names.get(bind)
            if bind_name is not None:
                return keys[col.name], bind_name
    return None
