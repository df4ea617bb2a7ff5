"""CPU time and memory of named processes, read from /proc: what a control plane costs.

CPU is utime + stime of /proc/<pid>/stat (every thread of the process, in clock ticks, 10 ms on
this kernel): the figures are meant for windows of seconds. A process that exits inside a window
(e.g. restarted) is counted up to its last reading. schedstat_ns reads the scheduler's own count
(ns) for shorter windows.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK     # utime, stime (fields 14, 15 of stat)


def schedstat_ns(pid: int) -> int:
    """CPU time (ns) of every thread of a process, from /proc/<pid>/task/<tid>/schedstat: finer than
    the ticks of cpu_seconds, for windows shorter than seconds. A thread or process gone counts 0."""
    return sum(task_ns(pid).values())


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def children(pid: int) -> list[int]:
    """Every descendant of pid (e.g. a server's worker processes)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parent[int(d.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


class CpuWindow:
    """CPU seconds of named groups of processes between `start()` and each `read()`:
    groups = {group: {process name: pid}}."""

    def __init__(self, groups: dict[str, dict[str, int]]):
        self.groups = groups
        self.base: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def start(self) -> "CpuWindow":
        self.base = {pid: cpu_seconds(pid) or 0.0 for procs in self.groups.values() for pid in procs.values()}
        self.last = dict(self.base)
        return self

    def read(self) -> dict[str, dict]:
        """{group: {"total": s, "by_process": {name: s}}} since start()."""
        out = {}
        for group, procs in self.groups.items():
            by = {}
            for name, pid in procs.items():
                now = cpu_seconds(pid)
                if now is not None:
                    self.last[pid] = now
                by[name] = round(self.last.get(pid, 0.0) - self.base.get(pid, 0.0), 3)
            out[group] = {"total": round(sum(by.values()), 3), "by_process": by}
        return out


def rss(groups: dict[str, dict[str, int]]) -> dict[str, dict]:
    out = {}
    for group, procs in groups.items():
        by = {name: round(rss_mb(pid) or 0.0, 1) for name, pid in procs.items()}
        out[group] = {"total_mb": round(sum(by.values()), 1), "by_process_mb": by}
    return out


def thread_cpu_ns(pid: int, tid: int | None = None) -> int:
    """CPU time (ns) of one thread of a process (default its main thread, tid == pid), from its
    schedstat; 0 when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/task/{tid or pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def task_ns(pid: int) -> dict[int, int]:
    """{tid: CPU ns} of every thread of a process, from schedstat ({} when it is gone)."""
    out = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


class ThreadCpu:
    """CPU of every thread of process trees over a window, from the scheduler's own count
    (/proc/<pid>/task/<tid>/schedstat, ns) — `roots` = {group: pid}; a group is the process and
    all its descendants, found again at each sample (a PostgreSQL backend started in the window).

    A sampler thread reads every thread's count every `every` s. A thread is counted from its
    reading at start() (0 for a thread born in the window: its count is all in the window) to its
    last reading: a thread or process that ends in the window loses at most `every` s of its
    life; `born` and `ended` count them. `label(pid)` names a process's part of its group
    (e.g. "main thread" / "other threads"): `by_part` sums the parts."""

    def __init__(self, roots: dict[str, int], every: float = 0.1, label=None):
        self.roots, self.every, self.label = roots, every, label or (lambda group, pid, tid: group)
        self.base: dict[tuple[int, int], int] = {}
        self.last: dict[tuple[int, int], int] = {}
        self.part: dict[tuple[int, int], str] = {}
        self.seen_at_end: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="thread-cpu")

    def _sample(self) -> set[tuple[int, int]]:
        seen = set()
        for group, root in self.roots.items():
            for pid in (root, *children(root)):
                for tid, ns in task_ns(pid).items():
                    key = (pid, tid)
                    seen.add(key)
                    self.last[key] = ns
                    if key not in self.part:
                        self.part[key] = self.label(group, pid, tid)
        return seen

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def start(self) -> "ThreadCpu":
        self._sample()
        self.base = dict(self.last)
        self._thread.start()
        return self

    def stop(self) -> dict:
        """{"ms": {part: CPU ms}, "born": {part: threads born in the window}, "ended": {part: threads gone
        before the end}, "samples_every_s"}."""
        self._stop.set()
        self._thread.join()
        self.seen_at_end = self._sample()
        by: dict[str, float] = {}
        for key, ns in self.last.items():
            by[self.part[key]] = by.get(self.part[key], 0.0) + (ns - self.base.get(key, 0)) / 1e6
        born: dict[str, int] = {}
        ended: dict[str, int] = {}
        for key in self.last:
            if key not in self.base:
                born[self.part[key]] = born.get(self.part[key], 0) + 1
            if key not in self.seen_at_end:
                ended[self.part[key]] = ended.get(self.part[key], 0) + 1
        return {"ms": by, "born": born, "ended": ended, "samples_every_s": self.every}
