"""The model as a pass reads it from the store: whole, or only the parts the API wrote since the
last read (fathom.store.changes), with the statuses the store holds."""
from __future__ import annotations

from fathom.model import Snapshot
from fathom.store.changes import TableChanges
from fathom.store.snapshot import StoreReader


class StoreReads:
    """Reads of the store by the passes. `reads` counts them and `written` is the tables the last
    one read again (None: the whole store), for extensions that keep reads of their own tables
    across passes (fathom.controller.hostlocal); `stored` holds the statuses read with the model."""

    def __init__(self, session_factory):
        self.Session = session_factory
        engine = session_factory.kw.get("bind")     # a sessionmaker (fathom.store.db.session_factory)
        self._changes = TableChanges(engine) if engine is not None else None
        self.reader = StoreReader()
        self._written_last: set = set()             # tables (and port rows) the last read was for
        self.reads, self.written = 0, None
        self.stored: dict = {}

    def read(self, whole: bool) -> Snapshot:
        """The model from the store: every part of it (`whole`: the first pass, an explicit sync,
        the audit; rows written past the API are seen then), else only the parts whose tables
        were written since the last read. The tables this process's own writes wrote are read
        again by the next read too: such a write is counted as it is about to commit, so the
        previous read may have just missed it, and it is always followed by another wake-up,
        which reads it then. Those of another process's writes are not: the change feed counts
        them once committed (fathom.cluster.feed)."""
        own, elsewhere = self._changes.take_apart() if self._changes is not None else (None, None)
        written = None if whole or own is None else own | elsewhere | self._written_last
        self._written_last = own or set()
        self.reads, self.written = self.reads + 1, written
        stored: dict = {}
        with self.Session() as session:     # the reader opens its transaction (StoreReader.read)
            model = self.reader.read(session, stored, written)
        self.stored = stored
        return model
