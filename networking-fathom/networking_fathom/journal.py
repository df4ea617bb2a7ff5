"""The thread (one per Neutron API worker) that talks to fathom: it replays the journal, runs the full sync (at start and every
`[fathom] sync_interval` s) and turns ports ACTIVE in Neutron once fathom says they are.

Replay: pending entries in `seq` order; several pending entries of one object collapse into the
last one (each says the whole state), applied at the place of the first (a creation comes before
what refers to it) or, when the last is a deletion, at its own place (after what referred to it is
gone). Each Neutron API worker runs this thread: an object's entries are claimed before they are
sent, and an object another worker holds is left to it (networking_fathom.db), so fathom receives
one object's writes in Neutron's order whichever worker sends them. fathom unreachable (or a
5xx): the pass stops and is retried every `retry_interval` s, nothing is lost. fathom refusing an
entry (4xx, or a referenced object it lacks): the entry stays pending and is retried on the next
pass; after `max_attempts` it is marked failed (logged with fathom's reason) and the full sync
repairs what is repairable.

Port status (as ML2/OVN): a bound port gets a provisioning block at commit (networking_fathom.ml2);
when fathom reports the port `active` (its VIF is on br-int and the switches hold its flows) the
block is completed and ML2 sets it ACTIVE (Nova's network-vif-plugged). Nothing polls: each awaited
port has one long-poll at a time open on fathom (`GET /v1/ports/<id>?wait=active`, answered the
moment the controller decides the port is active), on a small pool of `status_waiters` threads.
A port not active after its long-poll goes to the back of the queue, and while more ports are
awaited than there are threads each long-poll lasts a second, not `status_wait`: ports that stay
down (their node lost, their VIF never plugged) delay the status of the others by at most one
`status_wait`, never hold it back.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from neutron_lib import context as n_context
from neutron_lib.callbacks import resources as cb_resources
from oslo_log import log as logging

from neutron.db import provisioning_blocks

from . import db
from .client import Client, FathomError, Unreachable
from .config import conf
from .resources import BY_JOURNAL_TYPE, Refs, Unmapped, apply_delete, apply_set, project_of

LOG = logging.getLogger(__name__)
QUEUED_WAIT = 1.0      # s a long-poll lasts while more ports are awaited than there are waiters


class Journal:
    _instance: "Journal | None" = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> "Journal":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __init__(self):
        self.event = threading.Event()
        self.thread: threading.Thread | None = None
        self.watch: dict[str, str | None] = {}        # Neutron port UUID -> project, awaiting active
        self.waiters: ThreadPoolExecutor | None = None
        self.next_sync = 0.0                           # 0: sync at the first chance (on start)
        self.api: Client | None = None
        self.last_sync: dict | None = None

    def start(self) -> None:
        with self._lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="fathom-journal", daemon=True)
                self.thread.start()

    def wake(self) -> None:
        self.event.set()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        while True:
            self.event.wait(conf().retry_interval)
            self.event.clear()
            try:
                self.tick()
            except Exception:      # keep the thread alive whatever happens; the next tick retries
                LOG.exception("fathom journal: unexpected error")

    def client(self) -> Client | None:
        if self.api is None:
            try:
                with open(conf().token_file) as f:
                    token = f.read().strip()
            except OSError as e:
                LOG.error("fathom: cannot read the service token %s: %s", conf().token_file, e)
                return None
            self.api = Client(conf().url, token, conf().timeout)
        return self.api

    def tick(self) -> None:
        api = self.client()
        if api is None:
            return
        ctx = n_context.get_admin_context()
        if not self.replay(api, ctx):
            return
        now = time.monotonic()
        if self.next_sync is not None and now >= self.next_sync:
            from .sync import full_sync
            try:
                self.last_sync = full_sync(api, ctx, self)
            except Unreachable as e:
                LOG.warning("fathom full sync: fathom unreachable (%s); retrying", e)
                return
            interval = conf().sync_interval
            self.next_sync = now + interval if interval > 0 else None
            db.purge_completed(ctx, conf().completed_retention)

    # ------------------------------------------------------------------ replay

    def replay(self, api: Client, ctx) -> bool:
        """Apply pending entries; False when fathom is unreachable (try again later)."""
        for _ in range(5):                       # passes: a refused entry may succeed after a later one
            entries = db.pending(ctx, limit=500)
            if not entries:
                return True
            groups: dict[str, list] = {}
            for e in entries:
                groups.setdefault(e.object_uuid, []).append(e)
            progress = False
            for uuid, group in sorted(groups.items(), key=_place):
                last, seqs = group[-1], [e.seq for e in group]
                if not db.claim(ctx, uuid, seqs):
                    continue                     # another worker sends this object's entries
                try:
                    what = self.apply(api, last.object_type, last.operation, json.loads(last.data))
                except Unreachable as e:
                    LOG.warning("fathom unreachable, journal entry %s waits: %s", last.seq, e)
                    db.finish(ctx, seqs, db.PENDING, str(e))
                    return False
                except (FathomError, Unmapped) as e:
                    state = db.FAILED if last.attempts + 1 >= conf().max_attempts else db.PENDING
                    log = LOG.error if state == db.FAILED else LOG.info
                    log("fathom refused %s %s %s (attempt %s): %s", last.operation, last.object_type, uuid,
                        last.attempts + 1, e)
                    db.finish(ctx, seqs, state, str(e), attempted=last.seq)
                    continue
                except BaseException:
                    db.finish(ctx, seqs, db.PENDING)     # not held by a thread that gave up on it
                    raise
                progress = True
                LOG.info("fathom: %s %s %s: %s", last.operation, last.object_type, uuid, what)
                db.finish(ctx, seqs, db.COMPLETED, attempted=last.seq)
            if not progress:
                return True
        return True

    def apply(self, api: Client, journal_type: str, operation: str, data: dict) -> str:
        project = project_of(data)
        mappings = BY_JOURNAL_TYPE[journal_type]
        if operation == "delete":
            return ", ".join(apply_delete(api, m, data["id"], project) for m in reversed(mappings))
        refs = Refs(api, project)
        # a kind that no longer wants the object deletes it first (a port becoming a router interface)
        wanted = []
        for m in mappings:
            try:
                wanted.append((m.wanted(data, refs) is not None, m))
            except Unmapped:
                wanted.append((True, m))
        done = [apply_set(api, m, data, refs) for _, m in sorted(wanted, key=lambda w: w[0])]
        if journal_type == "port" and data.get("binding:host_id"):
            self.watch_port(data["id"], project)
        return ", ".join(d for d in done if d != "not mapped") or "not mapped"

    # ------------------------------------------------------------------ port status

    def watch_port(self, uuid: str, project: str | None) -> None:
        """Await the port's activity in fathom (once per port, however often it is asked)."""
        with self._lock:
            if uuid in self.watch:
                return
            self.watch[uuid] = project
            if self.waiters is None:
                self.waiters = ThreadPoolExecutor(conf().status_waiters, thread_name_prefix="fathom-port-status")
        self._queue(uuid)

    def _queue(self, uuid: str) -> None:
        self.waiters.submit(self._await_port, uuid)

    def _await_port(self, uuid: str) -> None:
        """One long-poll, then back to the end of the queue if the port is not active yet: ports
        that stay down (a node that is lost, a VIF never plugged) never keep the others waiting."""
        try:
            if uuid in self.watch and not self._port_done(uuid):
                self._queue(uuid)
        except Exception:
            LOG.exception("fathom: awaiting port %s", uuid)
            self.watch.pop(uuid, None)

    def _port_done(self, uuid: str) -> bool:
        """One long-poll for the port; True once it is active (completed in Neutron) or gone."""
        api, project = self.client(), self.watch.get(uuid)
        try:
            port = api.by_external_id("ports", uuid, project) if api else None
            if port is not None and port["status"] != "active":
                # a long wait only while every awaited port has a waiter of its own
                crowded = len(self.watch) > conf().status_waiters
                wait = min(conf().status_wait, QUEUED_WAIT) if crowded else conf().status_wait
                port = api.wait_status("ports", port["id"], "active", wait, project)
        except Unreachable as e:
            LOG.info("fathom unreachable while awaiting port %s: %s", uuid, e)
            time.sleep(conf().retry_interval)
            return False
        except FathomError as e:
            if e.status != 404:
                raise
            port = None
        if port is None:
            self.watch.pop(uuid, None)      # deleted: the journal or the full sync watches it again
            return True
        if port["status"] != "active":
            if port["status"] == "error":       # answered at once: ask again a little later
                time.sleep(conf().retry_interval)
            return False
        self.watch.pop(uuid, None)
        provisioning_blocks.provisioning_complete(n_context.get_admin_context(), uuid, cb_resources.PORT,
                                                  provisioning_blocks.L2_AGENT_ENTITY)
        LOG.info("fathom: port %s is active", uuid)
        return True


def _place(item) -> int:
    """Where a collapsed group of one object's entries is applied (see the module's docstring)."""
    entries = item[1]
    return entries[-1].seq if entries[-1].operation == "delete" else entries[0].seq
