"""A live trace's part on this node (fathom.api.agent_traces; docs/trace.md): the observation
points and, on the source node, the probe's injection.

- `arm`: start `livetrace-watch` (native/pptmon/livetrace.c) on the named interfaces of this
  node's bridges that are kernel interfaces (others are listed as not watched), for the trace's
  probe (an ICMP echo, or with `tcp` a TCP SYN); answered once its programs are attached.
- `inject`: send the probe's frame (or a TCP probe's closing RST) on the source port's switch-side interface from a packet socket
  carrying the injection mark: the watcher's egress program turns it into the interface's ingress
  (the switch takes it from the port; the VM never sees it).
- `collect`: end the watcher (its programs are detached, nothing stays behind) and answer what
  it saw, with this host's monotonic-to-real-time offset so that the controller can put sightings of
  several hosts on one time line.

A watcher ends by itself after its timeout (at most 20 s) even when no `collect` comes; at most
MAX_WATCHERS run at once.
"""
from __future__ import annotations

import json
import logging
import re
import select
import socket
import subprocess
import time

from fathom.agent.local import LocalOvs
from fathom.pptmon import native

LOG = logging.getLogger("fathom.agent.livetrace")
WATCH = native.BUILD / "livetrace-watch"
INJECT_MARK = 0x66744C54          # LT_INJECT_MARK of native/pptmon/livetrace.h
SO_MARK = getattr(socket, "SO_MARK", 36)
BRIDGES = ("br-int", "br-phy")
MAX_WATCHERS, MAX_DEVS, MAX_FRAME = 2, 32, 9216
ATTACH_WAIT = 10.0                # seconds a watcher may take to load and attach (a busy host)
TRACE_RE = re.compile(r"^[0-9a-f]{1,32}$")
DEV_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")


class LiveTraces:
    def __init__(self, ovs: LocalOvs):
        self.ovs = ovs
        self.watchers: dict[str, tuple[subprocess.Popen, float]] = {}

    def run(self, ask: dict) -> dict:
        kind, trace = ask.get("kind"), ask.get("trace")
        if not isinstance(trace, str) or not TRACE_RE.match(trace):
            return {"error": "not a live trace request this agent runs (trace id)"}
        self._reap()
        if kind == "live-arm":
            return self.arm(trace, ask)
        if kind == "live-inject":
            return self.inject(trace, ask)
        if kind == "live-collect":
            return self.collect(trace)
        return {"error": f"not a trace request this agent runs: {str(kind)[:40]!r}"}

    def arm(self, trace: str, ask: dict) -> dict:
        probe, devs, timeout = ask.get("probe") or {}, ask.get("devs") or [], ask.get("timeout_ms")
        drop_reply = ask.get("drop_reply")
        fields = ("dscp", "ip_id", "icmp_id", "icmp_seq")
        if not all(isinstance(probe.get(k), int) and 0 <= probe[k] <= (63 if k == "dscp" else 0xFFFF) for k in fields) \
                or not isinstance(devs, list) or not 0 < len(devs) <= MAX_DEVS \
                or any(not isinstance(d, str) or not DEV_RE.match(d) for d in devs) \
                or not isinstance(timeout, int) or not 0 < timeout <= 20000 \
                or drop_reply is not None and drop_reply not in devs:
            return {"error": "not a live trace request this agent runs (probe, devs or timeout out of bounds)"}
        if trace in self.watchers:
            return {"error": f"trace {trace} is armed here already"}
        if len(self.watchers) >= MAX_WATCHERS:
            return {"error": f"{MAX_WATCHERS} live traces are running on this node"}
        ours = set().union(*(self.ovs.ports(b) for b in BRIDGES))
        watched = [d for d in dict.fromkeys(devs) if d in ours and _kernel_interface(d)]
        skipped = [d for d in devs if d not in watched]
        if not watched:
            return {"live": {"watched": [], "not_watched": skipped}}
        args = [str(WATCH), *(f"--{k.replace('_', '-')}={probe[k]}" for k in fields), f"--timeout-ms={timeout}"]
        if drop_reply in watched:
            args.append(f"--drop-reply={drop_reply}")
        if ask.get("tcp") is True:
            args.append("--tcp")
        proc = subprocess.Popen([*args, *watched], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = _readline(proc, ATTACH_WAIT)
        if '"attached"' not in line:
            _, err = _end(proc)
            LOG.warning("trace %s: livetrace-watch did not attach: %s", trace, (line + err).strip()[:300])
            return {"error": f"livetrace-watch did not attach: {(line + err).strip()[:1500] or 'no output'}"}
        self.watchers[trace] = (proc, time.monotonic() + timeout / 1000 + 5)
        return {"live": {"watched": watched, "not_watched": skipped}}

    def inject(self, trace: str, ask: dict) -> dict:
        dev, frame = ask.get("dev"), ask.get("frame")
        if trace not in self.watchers:
            return {"error": f"trace {trace} is not armed here: no probe sent"}
        if not isinstance(dev, str) or not DEV_RE.match(dev) or not isinstance(frame, str) \
                or not re.fullmatch(r"([0-9a-f]{2}){42,%d}" % MAX_FRAME, frame):
            return {"error": "not a live trace request this agent runs (dev or frame out of bounds)"}
        if dev not in self.ovs.ports("br-int"):
            return {"error": f"{dev} is not a port of this node's br-int: no probe sent"}
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.setsockopt(socket.SOL_SOCKET, SO_MARK, INJECT_MARK)
            s.bind((dev, 0))
            s.send(bytes.fromhex(frame))
        return {"live": {}}

    def collect(self, trace: str) -> dict:
        got = self.watchers.pop(trace, None)
        if got is None:
            return {"error": f"trace {trace} is not armed here (it timed out?)"}
        out, err = _end(got[0])
        seen = []
        for line in out.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") == "seen":
                rec.pop("type")
                seen.append(rec)
        offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        return {"live": {"seen": seen[:256], "realtime_offset_ns": offset,
                         **({"watcher_error": err.strip()[:500]} if got[0].returncode else {})}}

    def _reap(self) -> None:
        """Watchers whose trace was never collected: ended (their own timeout has passed)."""
        now = time.monotonic()
        for trace, (proc, until) in list(self.watchers.items()):
            if now > until:
                _end(proc)
                del self.watchers[trace]


def _end(proc: subprocess.Popen) -> tuple[str, str]:
    """End a watcher (its stdin closed: it detaches its programs, then exits; SIGTERM does the same
    if it does not) and return what it printed."""
    try:
        return proc.communicate(input="", timeout=5)
    except subprocess.TimeoutExpired:
        proc.terminate()
    try:
        return proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def _kernel_interface(dev: str) -> bool:
    """A kernel network interface of this namespace (an OVS patch or userspace tunnel port is none)."""
    try:
        socket.if_nametoindex(dev)
    except OSError:
        return False
    return True


def _readline(proc: subprocess.Popen, seconds: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    return proc.stdout.readline() if ready else ""
