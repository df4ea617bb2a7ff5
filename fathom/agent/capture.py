"""Capture requests the controller hands the agent with its desired state (fathom.api.agent_captures):
what a tap policy's monitor port receives, as a pcap file posted back to the controller.

tcpdump on the port's interface (the host end of the VM's link on br-int), frames OVS sends out to
the VM only (`-Q out`: what the monitor receives), written to a pipe. The agent checks every request
itself (an interface that is a port of br-int, bounded seconds, packets and bytes), runs tcpdump with
an argument list, no shell, and keeps whole pcap records within the byte bound. Each capture runs
in a thread of its own (the agent's loop goes on meanwhile) with its own connection to the
controller; at most MAX_RUNNING at once.
"""
from __future__ import annotations

import base64
import logging
import os
import re
import selectors
import signal
import struct
import subprocess
import threading
import time

from fathom import programs

LOG = logging.getLogger("fathom.agent.capture")
# as the controller bounds them (fathom.api.agent_captures; repeated here: the agent loads no API code)
MAX_SECONDS, MAX_BYTES, MAX_COUNT = 30.0, 512 * 1024, 1_000_000
MAX_RUNNING = 2
INTERFACE_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
PCAP_HEADER, RECORD_HEADER = 24, 16


def whole_records(data: bytes, limit: int) -> tuple[bytes, int]:
    """The pcap file `data` cut to at most `limit` bytes at a record's end, and its record count."""
    if len(data) < PCAP_HEADER:
        return b"", 0
    order = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    end, n = PCAP_HEADER, 0
    while end + RECORD_HEADER <= len(data):
        (incl,) = struct.unpack(order + "I", data[end + 8:end + 12])
        nxt = end + RECORD_HEADER + incl
        if nxt > len(data) or nxt > limit:
            break
        end, n = nxt, n + 1
    return data[:end], n


class Capturer:
    def __init__(self, ovs, http, node: str):
        """`ovs`: fathom.agent.local.LocalOvs; `http`: a client on the controller of its own (a
        capture's answer must not wait behind the agent's long-poll)."""
        self.ovs, self.http, self.node = ovs, http, node
        self.slots = threading.BoundedSemaphore(MAX_RUNNING)

    def start(self, ask: dict) -> None:
        """Capture in a thread of its own and post the answer."""
        threading.Thread(target=self._answer, args=(ask,), name="capture", daemon=True).start()

    def _answer(self, ask: dict) -> None:
        try:
            if not self.slots.acquire(blocking=False):
                answer = {"error": f"this agent runs {MAX_RUNNING} captures already"}
            else:
                try:
                    answer = self.run(ask)
                finally:
                    self.slots.release()
            r = self.http.post(f"/v1/agents/{self.node}/captures/{int(ask['id'])}", json=answer)
            if r.status_code != 204:
                LOG.warning("capture %s: the controller took no answer: HTTP %d: %s", ask.get("id"), r.status_code,
                            r.text[:300])
        except Exception as e:  # noqa: BLE001 - one capture must not stop the agent
            LOG.warning("capture %s: %s: %s", ask.get("id") if isinstance(ask, dict) else "?", type(e).__name__, e)

    def run(self, ask: dict) -> dict:
        """The answer to one request: {"pcap": base64 of the file} or {"error": why not}."""
        iface, seconds, max_bytes, count = (ask.get(k) for k in ("interface", "seconds", "max_bytes", "count"))
        if not isinstance(iface, str) or not INTERFACE_RE.match(iface) \
                or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS \
                or not isinstance(max_bytes, int) or not PCAP_HEADER < max_bytes <= MAX_BYTES \
                or not (count is None or (isinstance(count, int) and 0 < count <= MAX_COUNT)):
            return {"error": "not a capture request this agent runs (interface, seconds, count or bytes out of bounds)"}
        if iface not in self.ovs.ports("br-int"):
            return {"error": f"{iface} is not a port of this node's br-int"}
        if programs.path("tcpdump") is None:
            return {"error": programs.missing_message("tcpdump")}
        data, said = self._tcpdump(["tcpdump", "-i", iface, "-Q", "out", "-n", "-s", "0", "-U", "--immediate-mode",
                                    "-w", "-", *(["-c", str(count)] if count else [])], seconds, max_bytes)
        pcap, packets = whole_records(data, max_bytes)
        if not pcap:
            return {"error": f"tcpdump on {iface}: {said.strip()[-1500:] or 'no output'}"}
        LOG.info("captured %d packets (%d bytes) on %s", packets, len(pcap), iface)
        return {"pcap": base64.b64encode(pcap).decode()}

    @staticmethod
    def _tcpdump(cmd: list[str], seconds: float, max_bytes: int) -> tuple[bytes, str]:
        """What tcpdump wrote to its pipe in `seconds` (or until it ended: its count), at most a
        record beyond `max_bytes`; and what it said on stderr."""
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        data = bytearray()
        deadline = time.monotonic() + seconds
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while len(data) <= max_bytes and (left := deadline - time.monotonic()) > 0:
                if not sel.select(left):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break            # tcpdump ended (its count, or a failure)
                data += chunk
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            rest, said = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, said = proc.communicate()
        if len(data) <= max_bytes:
            data += rest[:max_bytes + 65536]
        return bytes(data), said.decode("utf-8", "replace")
