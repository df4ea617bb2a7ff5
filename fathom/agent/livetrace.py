"""A live trace's part on this node (fathom.api.agent_traces; docs/trace.md): the observation
points and, on the source node, the probe's injection.

The observation points of every trace on this node are one `livetrace-watch` process
(native/pptmon/livetrace.c), started by the first trace and kept while traces come: it loads its
eBPF programs once, attaches them to an interface the first time a trace watches it, and keeps
them attached; a trace is armed by writing its mark into the programs' map and disarmed by clearing
it. After IDLE seconds without an armed trace the process detaches every program and exits (the
next trace starts another); it also exits, detaching them, when this agent goes (its stdin closes).

- `arm`: the named interfaces of this node's bridges that are kernel interfaces are watched
  (others are listed as not watched) and the trace's probe (an ICMP echo, or with `tcp` a TCP SYN)
  is armed; answered once its programs are attached there. On the source node (armed last) the
  request carries the probe to `inject` once armed: its frame is sent on the source port's
  switch-side interface from a packet socket carrying the injection mark, and the watcher's egress
  program turns it into the interface's ingress (the switch takes it from the port; the VM never
  sees it). With `collect_after_ms` the source node then waits that long (the probe and its
  answer cross the cloud) and collects its own points in the same answer: a TCP probe's RST
  (`reset`) is injected first.
- `collect`: disarm the trace (its mark is cleared: nothing of it stays behind) and answer what
  it saw, with this host's monotonic-to-real-time offset so that the controller can put sightings of
  several hosts on one time line. A TCP probe's source node first injects the RST that closes what
  the SYN opened (`inject`), as the probe.

A trace not collected is disarmed after its timeout (at most 20 s); at most MAX_TRACES are armed at once.
"""
from __future__ import annotations

import itertools
import json
import logging
import re
import socket
import subprocess
import threading
import time

from fathom.agent.local import LocalOvs
from fathom.host.exec import CommandError
from fathom.pptmon import native

LOG = logging.getLogger("fathom.agent.livetrace")
WATCH = native.BUILD / "livetrace-watch"
INJECT_MARK = 0x66744C54          # LT_INJECT_MARK of native/pptmon/livetrace.h
SO_MARK = getattr(socket, "SO_MARK", 36)
BRIDGES = ("br-int", "br-phy")
MAX_TRACES, MAX_DEVS, MAX_FRAME = 2, 32, 9216
MAX_SETTLE_MS = 1000              # the longest wait between injecting and collecting on the source node
ATTACH_WAIT = 10.0                # seconds a watcher may take to load and attach (a busy host)
IDLE = 5.0                        # seconds without a trace after which the watcher detaches and ends
PORTS_FOR = 2.0                   # seconds the bridges' port list is taken as read (back-to-back traces ask once)
TRACE_RE = re.compile(r"^[0-9a-f]{1,32}$")
DEV_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")


class Watcher:
    """One `livetrace-watch` process: commands in, its answers and sightings out (read by a thread
    of its own, sightings kept by trace tag until collected)."""
    numbers = itertools.count(1)

    def __init__(self, idle: float):
        self.number = next(self.numbers)
        self.proc = subprocess.Popen([str(WATCH), f"--idle-ms={int(idle * 1000)}"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.cond = threading.Condition()
        self.replies: dict[int, dict] = {}
        self.seen: dict[int, list[dict]] = {}
        self.ended = False
        threading.Thread(target=self._read, daemon=True, name=f"livetrace-watch-{self.number}").start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            with self.cond:
                tag = rec.pop("tag", None)
                if rec.get("type") == "seen":
                    if tag in self.seen and len(self.seen[tag]) < 256:
                        rec.pop("type")
                        self.seen[tag].append(rec)
                elif tag is not None:
                    self.replies[tag] = rec
                    self.cond.notify_all()
        self.proc.wait()
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def alive(self) -> bool:
        return not self.ended and self.proc.poll() is None

    def ask(self, tag: int, line: str, seconds: float) -> dict:
        """Send one command about trace `tag`; its answer, or {"type": "error", ...} when none comes."""
        with self.cond:
            self.replies.pop(tag, None)
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            return {"type": "error", "error": "livetrace-watch has ended"}
        with self.cond:
            self.cond.wait_for(lambda: tag in self.replies or self.ended, seconds)
            return self.replies.pop(tag, None) or {"type": "error", "error": "livetrace-watch gave no answer"
                                                   + (" (it ended)" if self.ended else f" within {seconds:g} s")}

    def end(self) -> None:
        """Close its stdin: it detaches every program and exits."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.terminate()
            self.proc.wait()


class LiveTraces:
    def __init__(self, ovs: LocalOvs, idle: float = IDLE):
        self.ovs = ovs
        self.idle = idle
        self.watcher: Watcher | None = None
        self.tags = itertools.count(1)
        self.traces: dict[str, tuple[int, float, list[str]]] = {}   # trace -> (tag, until, watched devs)
        self.ports: tuple[float, set[str]] = (float("-inf"), set())     # (read at, the bridges' ports)

    def run(self, ask: dict) -> dict:
        kind, trace = ask.get("kind"), ask.get("trace")
        if not isinstance(trace, str) or not TRACE_RE.match(trace):
            return {"error": "not a live trace request this agent runs (trace id)"}
        self._reap()
        if kind == "live-arm":
            return self.arm(trace, ask)
        if kind == "live-collect":
            return self.collect(trace, ask)
        return {"error": f"not a trace request this agent runs: {str(kind)[:40]!r}"}

    def arm(self, trace: str, ask: dict) -> dict:
        probe, devs, timeout = ask.get("probe") or {}, ask.get("devs") or [], ask.get("timeout_ms")
        drop_reply, settle = ask.get("drop_reply"), ask.get("collect_after_ms", 0)
        fields = ("dscp", "ip_id", "icmp_id", "icmp_seq")
        if not all(isinstance(probe.get(k), int) and 0 <= probe[k] <= (63 if k == "dscp" else 0xFFFF) for k in fields) \
                or not isinstance(devs, list) or not 0 < len(devs) <= MAX_DEVS \
                or any(not isinstance(d, str) or not DEV_RE.match(d) for d in devs) \
                or not isinstance(timeout, int) or not 0 < timeout <= 20000 \
                or drop_reply is not None and drop_reply not in devs \
                or not isinstance(settle, int) or not 0 <= settle <= MAX_SETTLE_MS:
            return {"error": "not a live trace request this agent runs (probe, devs, timeout or wait out of bounds)"}
        if trace in self.traces:
            return {"error": f"trace {trace} is armed here already"}
        if len(self.traces) >= MAX_TRACES:
            return {"error": f"{MAX_TRACES} live traces are running on this node"}
        ours = self._ports()
        watched = [d for d in dict.fromkeys(devs) if d in ours and _kernel_interface(d)]
        skipped = [d for d in devs if d not in watched]
        if not watched:
            return {"live": {"watched": [], "not_watched": skipped}}
        tag = next(self.tags)
        proto = "tcp" if ask.get("tcp") is True else "icmp"
        line = " ".join(["arm", str(tag), *(str(probe[k]) for k in fields), proto,
                         drop_reply if drop_reply in watched else "-", str(timeout), *watched])
        for _ in range(2):      # once more with a new watcher when the last one ended on its idle time just now
            if self.watcher is None or not self.watcher.alive():
                try:
                    self.watcher = Watcher(self.idle)
                except OSError as e:
                    return {"error": f"livetrace-watch did not start: {e}"[:1500]}
            with self.watcher.cond:
                self.watcher.seen[tag] = []
            got = self.watcher.ask(tag, line, ATTACH_WAIT)
            if got.get("type") == "armed" or not self.watcher.ended:
                break
        if got.get("type") != "armed":
            with self.watcher.cond:
                self.watcher.seen.pop(tag, None)
            LOG.warning("trace %s: livetrace-watch did not arm it: %s", trace, got.get("error"))
            return {"error": f"livetrace-watch did not arm the trace: {str(got.get('error'))[:1500]}"}
        self.traces[trace] = (tag, time.monotonic() + timeout / 1000 + 5, watched)
        out = {"watched": watched, "not_watched": skipped,
               "watcher": {"number": self.watcher.number, "attached": got.get("attached", [])}}
        if "inject" in ask:
            why = self._inject(trace, ask["inject"])
            out.update({"injected": True} if why is None else {"not_injected": why})
            if why is None and "collect_after_ms" in ask:
                # the source node collects its own points once the probe and its answer had the
                # time to cross the cloud (one request fewer to this node than arm, then collect)
                time.sleep(settle / 1000)
                out.update(self.collect(trace, {"inject": ask["reset"]} if "reset" in ask else {}).get("live", {}))
        return {"live": out}

    def _inject(self, trace: str, inject) -> str | None:
        """Send a probe's frame on an interface the trace watches here; why not, if it was not sent."""
        dev, frame = (inject.get("dev"), inject.get("frame")) if isinstance(inject, dict) else (None, None)
        if not isinstance(dev, str) or not DEV_RE.match(dev) or not isinstance(frame, str) \
                or not re.fullmatch(r"([0-9a-f]{2}){42,%d}" % MAX_FRAME, frame):
            return "not a probe this agent sends (dev or frame out of bounds)"
        if dev not in self.traces[trace][2]:
            return f"{dev} is not an interface this trace watches on this node"
        try:
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
                s.setsockopt(socket.SOL_SOCKET, SO_MARK, INJECT_MARK)
                s.bind((dev, 0))
                s.send(bytes.fromhex(frame))
        except OSError as e:
            return f"sending the probe on {dev}: {e}"
        return None

    def collect(self, trace: str, ask: dict) -> dict:
        if trace not in self.traces:
            return {"error": f"trace {trace} is not armed here (it timed out?)"}
        if "inject" in ask:
            why = self._inject(trace, ask["inject"])
            if why is not None:
                LOG.warning("trace %s: %s", trace, why)
        w, tag = self.watcher, self.traces.pop(trace)[0]
        answer = w.ask(tag, f"disarm {tag}", 5.0)
        with w.cond:
            seen = w.seen.pop(tag, [])
        offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        return {"live": {"seen": seen, "realtime_offset_ns": offset,
                         **({"watcher_error": str(answer.get("error"))[:500]} if answer.get("type") != "disarmed" else {})}}

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.end()

    def _ports(self) -> set[str]:
        """The ports of this node's bridges, read at most every PORTS_FOR seconds: one ovs-vsctl for
        both (one each when a bridge is missing)."""
        if time.monotonic() - self.ports[0] > PORTS_FOR:
            try:
                ports = set(self.ovs.vsctl(*(a for b in BRIDGES for a in ("--", "list-ports", b))).split())
            except CommandError:
                ports = set().union(*(self.ovs.ports(b) for b in BRIDGES))
            self.ports = (time.monotonic(), ports)
        return self.ports[1]

    def _reap(self) -> None:
        """Traces never collected: forgotten once their timeout has passed (the watcher has cleared their mark)."""
        now = time.monotonic()
        for trace, (tag, until, _) in list(self.traces.items()):
            if now > until:
                del self.traces[trace]
                if self.watcher is not None:
                    with self.watcher.cond:
                        self.watcher.seen.pop(tag, None)


def _kernel_interface(dev: str) -> bool:
    """A kernel network interface of this namespace (an OVS patch or userspace tunnel port is none)."""
    try:
        socket.if_nametoindex(dev)
    except OSError:
        return False
    return True
