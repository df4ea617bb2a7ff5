"""The agent's PPTMon record forwarder: deliver the records of this node's loaders to the controller.

(`fathom agent run` runs it beside the host-local follower, fathom.agent.follow.)

The loaders (fathom.pptmon.control) write JSON lines to <root>/<chain>/vnf<k>.jsonl; the sink's
file holds the "ppt" records. The agent follows those files (fathom.agent.tail: partial lines,
truncation, rotation, restarts), validates each record with the controller's own schema, and
POSTs batches to /v1/pptmon/records.

Delivery and loss, precisely:
* The in-memory buffer is bounded (`buffer` records). With `overflow="pause"` (default) a full
  buffer stops reading: the files are the backlog, nothing is dropped and the loaders are never
  slowed down (they write to their files, not to us); the lag shows in `lag_bytes`. With
  `overflow="drop-oldest"` reading goes on and the oldest buffered records are dropped and
  counted (`dropped_overflow`).
* A batch that fails (no connection, timeout, 5xx, 429, any unexpected status) is retried with
  exponential backoff and jitter (`backoff_min` doubling to `backoff_max`), never dropped.
* A record the controller refuses (422, with the index of the record in `loc`) is dropped and
  counted (`rejected`): sending it again cannot succeed. Lines that are not JSON (`bad_lines`) or
  not valid records (`invalid`) are counted too; lines of other types (stats, attached) are skipped.
* The checkpoint (state file) records, per file, the offset up to which every line is dealt
  with; it moves only after the controller acknowledged. A restart resumes there. A crash between
  an acknowledgement and the checkpoint write re-sends at most that batch; the controller's
  ingestion is idempotent on the record key, so nothing is counted twice.

Progress: a status file (JSON; `fathom agent status`), rewritten within a second when it
changed and every STATUS_REFRESH seconds otherwise, and a log line every `log_interval` seconds.

At rest the loop costs next to nothing: with no record file to follow it looks for new ones every
`idle_poll` seconds (else every `poll`), and the checkpoint and status files are written only when
what they say changed (the status file's `updated` also every STATUS_REFRESH seconds).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import random
import socket
import threading
import time
from collections import deque
from pathlib import Path

from fathom.agent.tail import Follower, Line
from fathom.pptmon import MAX_BATCH

LOG = logging.getLogger("fathom.agent")
STATE_DIR = Path(os.environ.get("FATHOM_AGENT_STATE", "/run/fathom/agent"))
OVERFLOW = ("pause", "drop-oldest")
STATUS_REFRESH = 30.0     # the status file's `updated` moves on at least this often


class AgentError(Exception):
    pass


def _write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


class Agent:
    def __init__(self, controller: str, root: str | Path | None = None, chains: list[str] | None = None,
                 node: str | None = None, batch: int = 500, buffer: int = 20_000, overflow: str = "pause",
                 poll: float = 0.2, flush: float = 1.0, timeout: float = 10.0,
                 backoff_min: float = 0.2, backoff_max: float = 30.0, state_dir: str | Path | None = None,
                 log_interval: float = 10.0, grace: float = 5.0, headers: dict | None = None,
                 final_flush: float = 5.0, verify: bool | str = True, idle_poll: float = 2.0, http=None):
        from fathom.pptmon.chain import STATE_ROOT
        if overflow not in OVERFLOW:
            raise ValueError(f"overflow is one of {OVERFLOW}")
        if not 1 <= batch <= MAX_BATCH:
            raise ValueError(f"batch is 1..{MAX_BATCH}")
        if buffer < batch:
            raise ValueError("buffer must hold at least one batch")
        self.controller = controller.rstrip("/")
        self.root = Path(root or STATE_ROOT)
        self.node = node or socket.gethostname()
        if len(self.node) > 64:
            raise ValueError("node names have at most 64 characters")
        self.batch, self.buffer_max, self.overflow = batch, buffer, overflow
        self.poll, self.flush, self.timeout = poll, flush, timeout
        self.idle_poll = max(poll, idle_poll)
        self.backoff_min, self.backoff_max = backoff_min, backoff_max
        self.state_dir = Path(state_dir or STATE_DIR)
        self.log_interval = log_interval
        self.final_flush = final_flush
        patterns = [str(self.root / c / "vnf*.jsonl") for c in chains] if chains else \
            [str(self.root / "*" / "vnf*.jsonl")]
        self.follower = Follower(patterns, resume=self._load_checkpoint(), grace=grace)
        self.buffer: deque[tuple[Line, dict]] = deque()
        # headers: the node's agent token (Authorization: Bearer ...); `http`: a client to use instead
        if http is None:
            from fathom.agent.http import JsonClient
            http = JsonClient(self.controller, timeout=timeout, headers=headers or {}, verify=verify)
        self.http = http
        self.stopping = threading.Event()
        self.locked = threading.Event()   # set once this agent holds its state directory
        self.failures = 0
        self.next_attempt = 0.0
        self.oldest_since: float | None = None
        self.started = time.time()
        self.c = {"records_read": 0, "delivered": 0, "duplicates": 0, "rejected": 0, "invalid": 0,
                  "not_json": 0, "skipped_lines": 0, "dropped_overflow": 0, "batches_ok": 0,
                  "batches_failed": 0}
        self.last_error: str | None = None
        self.last_ok: float | None = None
        self._last_status = self._last_log = self._status_written = 0.0
        self._status_said: dict | None = None
        self._checkpoint_said: dict | None = None
        self._logged = dict(self.c)
        self.extra_status = lambda: {}   # more for the status file (the host-local follower's)

    # ------------------------------------------------------------------------------ state files

    @property
    def checkpoint_file(self) -> Path:
        return self.state_dir / "checkpoint.json"

    @property
    def status_file(self) -> Path:
        return self.state_dir / "status.json"

    def _load_checkpoint(self) -> dict:
        try:
            return json.loads(self.checkpoint_file.read_text()).get("files", {})
        except (OSError, ValueError):
            return {}

    def save_checkpoint(self, force: bool = True) -> None:
        files = self.follower.checkpoint()
        if force or files != self._checkpoint_said:
            _write_atomic(self.checkpoint_file, {"controller": self.controller, "files": files})
            self._checkpoint_said = files

    def save_status(self) -> None:
        """The status file, when it says something new or STATUS_REFRESH seconds passed."""
        st = self.status()
        said = {k: v for k, v in st.items() if k not in ("updated", "backoff_s")}
        now = time.monotonic()
        if said != self._status_said or now - self._status_written >= STATUS_REFRESH:
            _write_atomic(self.status_file, st)
            self._status_said, self._status_written = said, now

    def status(self) -> dict:
        return {"pid": os.getpid(), "node": self.node, "controller": self.controller, "root": str(self.root),
                "started": self.started, "updated": time.time(), "buffered": len(self.buffer),
                "buffer_max": self.buffer_max, "overflow": self.overflow,
                "lag_bytes": self.follower.lag_bytes(), "files": len(self.follower.current),
                "rotated_files_draining": len(self.follower.orphans),
                "backoff_s": max(0.0, round(self.next_attempt - time.monotonic(), 3)),
                "consecutive_failures": self.failures, "last_error": self.last_error,
                "last_delivery": self.last_ok, "counters": {**self.c, **self.follower.counters},
                "host_local": self.extra_status()}

    # ------------------------------------------------------------------------------ reading

    def _read(self) -> None:
        self.follower.scan()
        room = self.buffer_max - len(self.buffer)
        if room <= 0 and self.overflow == "pause":
            return
        self.follower.read(max_ready=max(room, self.batch))
        want = room if self.overflow == "pause" else self.buffer_max
        for line in self.follower.pull(want):
            self._take(line)
        if self.buffer and self.oldest_since is None:
            self.oldest_since = time.monotonic()

    def _take(self, line: Line) -> None:
        data = line.data.strip()
        if not data:
            Follower.done(line)
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self.c["not_json"] += 1
            Follower.done(line)
            return
        if not isinstance(obj, dict) or obj.get("type") != "ppt":
            self.c["skipped_lines"] += 1
            Follower.done(line)
            return
        from pydantic import ValidationError   # only once records flow (a slim agent otherwise)

        from fathom.pptmon.records import PptRecord
        try:
            PptRecord.model_validate(obj)
        except ValidationError as e:
            self.c["invalid"] += 1
            self.last_error = f"invalid record in {line.tail.path}@{line.start}: {e.errors()[0]['msg']}"
            Follower.done(line)
            return
        self.c["records_read"] += 1
        self.buffer.append((line, obj))
        while len(self.buffer) > self.buffer_max:   # drop-oldest only: pause never overfills
            old, _ = self.buffer.popleft()
            Follower.done(old)
            self.c["dropped_overflow"] += 1

    # ------------------------------------------------------------------------------ delivery

    def _due(self) -> bool:
        if not self.buffer or time.monotonic() < self.next_attempt:
            return False
        return (len(self.buffer) >= self.batch or self.stopping.is_set()
                or time.monotonic() - (self.oldest_since or 0) >= self.flush)

    def _fail(self, why: str) -> None:
        self.failures += 1
        self.c["batches_failed"] += 1
        delay = min(self.backoff_max, self.backoff_min * 2 ** (self.failures - 1))
        delay *= random.uniform(0.5, 1.0)
        self.next_attempt = time.monotonic() + delay
        if self.last_error != why or self.failures in (1, 5) or self.failures % 20 == 0:
            LOG.warning("delivery failed (%d in a row, retry in %.1fs): %s", self.failures, delay, why)
        self.last_error = why

    def _ack(self, n: int) -> None:
        for _ in range(n):
            line, _ = self.buffer.popleft()
            Follower.done(line)
        self.oldest_since = time.monotonic() if self.buffer else None

    def send(self) -> bool:
        """POST one batch; True if the controller answered it (accepted or refused)."""
        items = [self.buffer[i] for i in range(min(self.batch, len(self.buffer)))]
        body = {"node": self.node, "records": [o for _, o in items]}
        try:
            r = self.http.post("/v1/pptmon/records", json=body)
        except Exception as e:  # noqa: BLE001 - any transport failure (the client's own errors)
            self._fail(f"{type(e).__name__}: {e}")
            return False
        try:
            out = r.json() if r.status_code == 200 else None
        except ValueError:
            out = None
        if r.status_code == 200 and isinstance(out, dict):
            self.c["delivered"] += out.get("accepted", 0)
            self.c["duplicates"] += out.get("duplicates", 0)
            self.c["batches_ok"] += 1
            self._ack(len(items))
            self.failures, self.next_attempt, self.last_ok = 0, 0.0, time.time()
            self.save_checkpoint()
            return True
        if r.status_code == 422:
            bad = self._refused(r, len(items))
            if bad:
                # drop the refused records, keep the others at the front for the next attempt
                keep = [it for i, it in enumerate(items) if i not in bad]
                for i in sorted(bad):
                    Follower.done(items[i][0])
                for _ in items:
                    self.buffer.popleft()
                self.buffer.extendleft(reversed(keep))
                self.c["rejected"] += len(bad)
                self.last_error = f"controller refused {len(bad)} records: {r.text[:300]}"
                LOG.warning("%s", self.last_error)
                return True
            # refused, but not record by record: the batch as a whole can never pass
            for line, _ in items:
                Follower.done(line)
            for _ in items:
                self.buffer.popleft()
            self.c["rejected"] += len(items)
            self.last_error = f"controller refused a batch of {len(items)}: {r.text[:300]}"
            LOG.error("%s", self.last_error)
            self.save_checkpoint()
            return True
        self._fail(f"HTTP {r.status_code}: {r.text[:300]}")
        return False

    @staticmethod
    def _refused(r, n: int) -> set[int]:
        try:
            detail = r.json()["detail"]
            idx = {d["loc"][2] for d in detail
                   if list(d["loc"][:2]) == ["body", "records"] and len(d["loc"]) > 2 and isinstance(d["loc"][2], int)}
        except (ValueError, KeyError, TypeError, IndexError):
            return set()
        return {i for i in idx if 0 <= i < n}

    # ------------------------------------------------------------------------------ loop

    def step(self) -> bool:
        """One round: read, maybe send, maybe report. True if it sent something."""
        self._read()
        sent = False
        if self._due():
            sent = self.send()
        now = time.monotonic()
        if now - self._last_status >= 1.0:
            self._last_status = now
            self.save_status()
            self.save_checkpoint(force=False)
        if self.log_interval and now - self._last_log >= self.log_interval:
            self._last_log = now
            d = {k: self.c[k] - self._logged.get(k, 0) for k in self.c}
            self._logged = dict(self.c)
            LOG.info("delivered %d (+%d), duplicates %d, buffered %d, lag %d B, rejected %d, invalid %d, "
                     "dropped %d, failures %d%s", self.c["delivered"], d["delivered"], self.c["duplicates"],
                     len(self.buffer), self.follower.lag_bytes(), self.c["rejected"], self.c["invalid"],
                     self.c["dropped_overflow"], self.failures,
                     f", last error: {self.last_error}" if self.failures else "")
        return sent

    def _lock(self):
        """One agent per state directory: two would fight over the checkpoint."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.state_dir / "agent.lock", "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            other = fh.read().strip()
            fh.close()
            raise AgentError(f"another agent (pid {other or '?'}) uses {self.state_dir}") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        return fh

    def run(self) -> None:
        lock = self._lock()
        self.locked.set()
        LOG.info("agent on %s: following %s, delivering to %s", self.node, self.root, self.controller)
        try:
            while not self.stopping.is_set():
                try:
                    sent = self.step()
                except Exception:  # noqa: BLE001 - the agent outlives a bad moment (disk full, ...)
                    LOG.exception("agent step")
                    sent = False
                if not sent:
                    idle = not self.buffer and not self.follower.current and not self.follower.orphans
                    self.stopping.wait(self.idle_poll if idle else self.poll)
            # a last attempt for what is buffered: no backoff wait, at most `final_flush` seconds
            self.follower.scan()
            self._read()
            self.next_attempt = 0.0
            deadline = time.monotonic() + self.final_flush
            while self.buffer and time.monotonic() < deadline and self.send():
                pass
        finally:
            self.save_checkpoint()
            _write_atomic(self.status_file, {**self.status(), "stopped": time.time()})
            self.follower.close()
            self.http.close()
            lock.close()

    def stop(self) -> None:
        self.stopping.set()
