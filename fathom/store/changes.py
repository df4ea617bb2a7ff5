"""Which tables committed writes touched since the controller last asked (`TableChanges.take`), so
it re-reads only those parts of the store (fathom.store.snapshot.StoreReader) after an API write.

Every INSERT, UPDATE and DELETE an engine runs is noted per connection and counted once its
transaction commits (a rolled-back write counts for nothing). A DELETE also counts for the tables
whose foreign keys cascade from it (ON DELETE CASCADE / SET NULL, transitively); a statement whose
table cannot be told (raw SQL) counts for every table (`ALL`). Statements run with the execution
option `model_unchanged=True` (the reconciler's own status writes: statuses are not part of the
model) are not counted. Writes by another process are not seen: an explicit sync or the audit
reads the whole store.
"""
from __future__ import annotations

import re
import threading

from sqlalchemy import Engine, event

ALL = "*"
_DML = re.compile(r"\s*(insert|update|delete|replace)\b", re.IGNORECASE)
_PENDING = "fathom_written"


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


class TableChanges:
    """The tables an engine wrote since the last `take()` (one reader per tracker)."""

    def __init__(self, engine: Engine):
        self._lock = threading.Lock()
        self._written: set[str] = set()
        self._cascade = _cascades()
        event.listen(engine, "after_cursor_execute", self._executed)
        event.listen(engine, "commit", self._committed)
        event.listen(engine, "rollback", self._rolled_back)

    def take(self) -> set[str]:
        """The tables written by the transactions committed since the last call."""
        with self._lock:
            out, self._written = self._written, set()
        return out

    def _executed(self, conn, _cursor, statement, _parameters, context, _executemany) -> None:
        if context is None:
            return
        if context.execution_options.get("model_unchanged"):
            return
        if not (context.isinsert or context.isupdate or context.isdelete):
            if _DML.match(statement or ""):
                conn.info.setdefault(_PENDING, set()).add(ALL)
            return
        table = getattr(getattr(context.compiled, "statement", None), "table", None)
        name = getattr(table, "name", None)
        names = {name} if name else {ALL}
        if context.isdelete and name:
            names |= self._cascade.get(name, set())
        conn.info.setdefault(_PENDING, set()).update(names)
        if not conn.in_transaction():   # autocommit: there will be no commit event
            self._committed(conn)

    def _committed(self, conn) -> None:
        written = conn.info.pop(_PENDING, None)
        if written:
            with self._lock:
                self._written |= written

    def _rolled_back(self, conn) -> None:
        conn.info.pop(_PENDING, None)
