"""Following JSON-lines files that other processes append to, robustly.

`FileTail` follows one file (one inode) from a byte offset: it hands out complete lines with the
byte range they occupy and keeps a partial last line until its newline arrives. `Follower` maps
paths to tails and handles what happens to files underneath a reader:

* truncation (same inode, size below what was read: `copytruncate`): start again at 0;
* rotation (the path now names another inode, or is gone): the old inode is read to its end and
  followed for `grace` seconds more (a writer may still hold it open), the new file from 0;
* restarts: `checkpoint()` says, per path, which inode and up to which byte everything has been
  dealt with (delivered, or not a record); `Follower(resume=...)` starts there if the file is
  still the same one — same device and inode *and* the same first line (inode numbers are
  reused on tmpfs), else from 0.

What "dealt with" means is up to the caller: a line is outstanding from `pull()` until
`done(line)`; the checkpoint never passes the first outstanding line.
"""
from __future__ import annotations

import glob
import hashlib
import os
import time
from collections import deque
from dataclasses import dataclass, field

CHUNK = 64 * 1024
MAX_LINE = 1 << 20     # a "line" longer than this is garbage: dropped and counted
FP_MAX = 512           # the fingerprint is the file's first line, up to this many bytes


@dataclass(eq=False)
class Line:
    tail: "FileTail"
    data: bytes
    start: int
    end: int


def fingerprint(fh, limit: int = FP_MAX) -> str | None:
    """Hash of the file's first line (None while there is no complete first line)."""
    pos = fh.tell()
    try:
        fh.seek(0)
        head = fh.read(limit)
    finally:
        fh.seek(pos)
    nl = head.find(b"\n")
    if nl < 0 and len(head) < limit:
        return None
    return hashlib.sha256(head[: nl + 1 if nl >= 0 else limit]).hexdigest()[:32]


@dataclass(eq=False)
class FileTail:
    path: str
    fh: object
    dev: int
    ino: int
    pos: int = 0                      # bytes read from the file
    partial: bytearray = field(default_factory=bytearray)
    ready: deque = field(default_factory=deque)        # complete lines not yet pulled
    outstanding: deque = field(default_factory=deque)  # start offsets of pulled, not done lines
    fp: str | None = None
    orphan_since: float | None = None  # rotated away / deleted: when we noticed
    last_growth: float = field(default_factory=time.monotonic)

    @classmethod
    def open(cls, path: str, offset: int = 0) -> "FileTail":
        fh = open(path, "rb")
        st = os.fstat(fh.fileno())
        fh.seek(offset)
        t = cls(path=path, fh=fh, dev=st.st_dev, ino=st.st_ino, pos=offset)
        t.fp = fingerprint(fh)
        return t

    @property
    def next_start(self) -> int:
        """Offset of the first line not pulled yet."""
        if self.ready:
            return self.ready[0].start
        return self.pos - len(self.partial)

    @property
    def committed(self) -> int:
        return self.outstanding[0] if self.outstanding else self.next_start

    def size(self) -> int:
        return os.fstat(self.fh.fileno()).st_size

    def read(self, counters: dict, max_ready: int = 1000) -> None:
        """Read what has been appended, up to about `max_ready` complete lines waiting."""
        size = self.size()
        # truncated under us (what we had not read is gone) — also when it was rewritten past
        # our position between two looks: then its first line is another one
        if size < self.pos or (self.fp is not None and fingerprint(self.fh) != self.fp):
            counters["truncations"] += 1
            if self.partial:
                counters["partial_dropped"] += 1
            self.partial.clear()
            self.ready.clear()
            self.outstanding.clear()
            self.pos = 0
            self.fh.seek(0)
            self.fp = None
        while len(self.ready) < max_ready:
            chunk = self.fh.read(CHUNK)
            if not chunk:
                break
            self.last_growth = time.monotonic()
            start = self.pos - len(self.partial)
            self.pos += len(chunk)
            self.partial += chunk
            lines = self.partial.split(b"\n")
            rest = lines.pop()
            for data in lines:
                end = start + len(data) + 1
                if len(data) > MAX_LINE:
                    counters["bad_lines"] += 1
                else:
                    self.ready.append(Line(self, bytes(data), start, end))
                start = end
            self.partial = bytearray(rest)
            if len(self.partial) > MAX_LINE:   # no newline in sight: skip to the next one
                counters["bad_lines"] += 1
                self.partial.clear()
        if self.fp is None:
            self.fp = fingerprint(self.fh)

    def close(self, counters: dict) -> None:
        if self.partial:
            counters["partial_dropped"] += 1   # the writer never finished its last line
        try:
            self.fh.close()
        except OSError:
            pass


class Follower:
    """Follow every file matching `patterns` (globs), old inodes included until drained."""

    def __init__(self, patterns: list[str], resume: dict | None = None, grace: float = 5.0):
        self.patterns = patterns
        self.resume = dict(resume or {})
        self.grace = grace
        self.current: dict[str, FileTail] = {}   # path -> tail of the inode the path names now
        self.orphans: list[FileTail] = []
        self.counters = {"files": 0, "rotations": 0, "truncations": 0, "bad_lines": 0,
                         "partial_dropped": 0, "lines": 0}

    def _start(self, path: str) -> FileTail | None:
        try:
            t = FileTail.open(path)
        except OSError:
            return None
        cp = self.resume.pop(path, None)
        if cp and cp.get("dev") == t.dev and cp.get("ino") == t.ino and cp.get("fp") and \
                cp["fp"] == t.fp and 0 <= cp.get("offset", 0) <= t.size():
            t.fh.seek(cp["offset"])
            t.pos = cp["offset"]
        self.counters["files"] += 1
        return t

    def scan(self) -> None:
        now = time.monotonic()
        paths = sorted({p for pat in self.patterns for p in glob.glob(pat)})
        for path in paths:
            t = self.current.get(path)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if t is not None and (st.st_dev, st.st_ino) != (t.dev, t.ino):
                self.counters["rotations"] += 1
                t.orphan_since = now
                self.orphans.append(t)
                t = None
            if t is None:
                t = self._start(path)
                if t is None:
                    continue
                self.current[path] = t
        for path in [p for p in self.current if p not in paths]:   # deleted (or renamed away)
            t = self.current.pop(path)
            t.orphan_since = now
            self.orphans.append(t)

    def read(self, max_ready: int) -> None:
        for t in [*self.orphans, *self.current.values()]:
            try:
                t.read(self.counters, max_ready)
            except OSError:
                pass
        now = time.monotonic()
        keep = []
        for t in self.orphans:
            if (not t.ready and not t.outstanding
                    and now - max(t.orphan_since or now, t.last_growth) >= self.grace):
                t.close(self.counters)
            else:
                keep.append(t)
        self.orphans = keep

    def pull(self, n: int) -> list[Line]:
        """Up to n complete lines, orphans (older data) first, then files in path order."""
        out: list[Line] = []
        for t in [*self.orphans, *self.current.values()]:
            while t.ready and len(out) < n:
                line = t.ready.popleft()
                t.outstanding.append(line.start)
                out.append(line)
            if len(out) >= n:
                break
        self.counters["lines"] += len(out)
        return out

    @staticmethod
    def done(line: Line) -> None:
        """The line was dealt with (delivered, skipped or dropped). Lines of one file are done in
        the order they were pulled; a truncation may have forgotten them already."""
        q = line.tail.outstanding
        if q and q[0] == line.start:
            q.popleft()
        elif line.start in q:
            q.remove(line.start)

    def lag_bytes(self) -> int:
        lag = 0
        for t in [*self.orphans, *self.current.values()]:
            try:
                lag += max(0, t.size() - t.committed)
            except OSError:
                pass
        return lag

    def checkpoint(self) -> dict:
        """path -> {dev, ino, fp, offset}: where a restarted follower may continue."""
        # files not opened (yet) keep their entry while they exist
        cp = {p: dict(v) for p, v in self.resume.items() if os.path.exists(p)}
        for path, t in self.current.items():
            cp[path] = {"dev": t.dev, "ino": t.ino, "fp": t.fp, "offset": t.committed}
        return cp

    def close(self) -> None:
        for t in [*self.orphans, *self.current.values()]:
            t.close(self.counters)
        self.orphans, self.current = [], {}
