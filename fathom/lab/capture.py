"""Packet captures as witnesses: tcpdump in a network namespace writing a pcap file, and tshark or a
plain reader to look into it. The one way the lab tests, the benchmarks and PPTMon's measurements
capture (the node agent never does).

    with Capture(lab.ns("vm1"), "eth0", tmp_path / "vm1.pcap", "icmp") as cap:   # listening here
        ...traffic...
    cap.fields("ip.src", "ip.dst", display="icmp.type == 8")   # [(src, dst), ...], read by tshark
    cap.dropped                                                # frames the kernel dropped on it

`ns=None` captures in the caller's own namespace (e.g. a lab's management bridge).
"""
from __future__ import annotations

import re
import signal
import struct
import subprocess
import time
from pathlib import Path

from fathom.host.exec import argv

from .sh import LabError

PCAP_NS_MAGIC = 0xA1B23C4D


class CaptureError(LabError):
    pass


class Capture:
    """tcpdump on `dev` in `ns` into `path`, whole frames, from `start()` (or entering the `with`
    block) until `stop()` (or leaving it).

    `immediate` (the default): each packet is handed to tcpdump at once, so the file is complete a
    moment after the traffic. Without it the kernel hands packets over a block at a time instead of
    waking tcpdump for each, which keeps the capture's own cost out of a path being measured; the
    price is that stopping waits for the last block (libpcap's 1 s timeout). `nano`: nanosecond
    timestamps (the kernel's software stamps). `direction`: "in" or "out" only. `buffer_kib`: the
    kernel's capture buffer, for bursts faster than tcpdump drains them. `count`: tcpdump stops by
    itself after that many packets (`wait` for it).
    """

    def __init__(self, ns: str | None, dev: str, path: str | Path, bpf_filter: str = "", *,
                 immediate: bool = True, nano: bool = False, direction: str | None = None,
                 buffer_kib: int | None = None, count: int | None = None):
        self.ns, self.dev, self.path, self.filter, self.count = ns, dev, Path(path), bpf_filter, count
        self.immediate, self.nano, self.direction, self.buffer_kib = immediate, nano, direction, buffer_kib
        self.proc: subprocess.Popen | None = None
        self.report = ""          # what tcpdump said when it stopped (its counts)

    def command(self) -> list[str]:
        options = ["-Z", "root", "-i", self.dev, "-n", "-s", "0", "-U", "-w", str(self.path)]
        if self.immediate:
            options.append("--immediate-mode")
        if self.nano:
            options.append("--time-stamp-precision=nano")
        if self.direction:
            options += ["-Q", self.direction]
        if self.buffer_kib:
            options += ["-B", str(self.buffer_kib)]
        if self.count:
            options += ["-c", str(self.count)]
        return argv(["tcpdump", *options, *([self.filter] if self.filter else [])], self.ns)

    def start(self, timeout: float = 10) -> "Capture":
        """Start tcpdump and return once it listens (it says "listening on ..." when its socket is bound)."""
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline, said = time.monotonic() + timeout, []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            said.append(line)
            if "listening on" in line:
                return self
            if not line and self.proc.poll() is not None:
                break
        self.stop()
        raise CaptureError(f"tcpdump on {self.ns or 'this namespace'}:{self.dev} did not start: {''.join(said)}")

    def wait(self, seconds: float | None = None) -> None:
        """Until tcpdump ends by itself (its `count` reached) or `seconds` pass (None: no limit)."""
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        """Stop tcpdump once the packets of the last moment are written (or, ended by itself, read
        what it said); `report` keeps its counts."""
        if self.proc is None or self.proc.stderr.closed:
            return
        if self.proc.poll() is None:
            time.sleep(0.5 if self.immediate else 1.2)
            self.proc.send_signal(signal.SIGINT)
        try:
            self.report = self.proc.communicate(timeout=10)[1] or ""
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.report = self.proc.communicate()[1] or ""

    def __enter__(self) -> "Capture":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def dropped(self) -> int | None:
        """Packets the kernel dropped before tcpdump read them (None: not told, e.g. still running)."""
        found = re.search(r"(\d+) packets? dropped by kernel", self.report)
        return int(found.group(1)) if found else None

    def fields(self, *names: str, display: str = "") -> list[tuple[str, ...]]:
        return fields(self.path, *names, display=display)


def _tshark(pcap: str | Path, args, check: bool) -> str:
    out = subprocess.run(["tshark", "-r", str(pcap), *args], capture_output=True, text=True, timeout=120)
    if check and out.returncode != 0:
        raise CaptureError(f"tshark -r {pcap} {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def tshark(pcap: str | Path, *args: str, check: bool = True) -> list[str]:
    """tshark's non-empty output lines for `pcap` (`check=False`: also when it complains, e.g. of a
    last packet cut short)."""
    return [line for line in _tshark(pcap, args, check).splitlines() if line.strip()]


def fields(pcap: str | Path, *names: str, display: str = "") -> list[tuple[str, ...]]:
    """One tuple per packet (shown by the `display` filter, if any) of the named fields' values;
    a field with several values (e.g. outer and inner ip.src) reads "outer,inner"."""
    args = ["-T", "fields", *(a for n in names for a in ("-e", n)), *(["-Y", display] if display else [])]
    return [tuple(line.split("\t")) for line in _tshark(pcap, args, True).splitlines() if line]


def read_pcap_ns(path: str | Path) -> list[tuple[int, bytes]]:
    """(timestamp_ns, frame) of each record of a nanosecond pcap file (Capture(nano=True))."""
    data = Path(path).read_bytes()
    if len(data) < 24:
        return []
    magic = struct.unpack("<I", data[:4])[0]
    if magic != PCAP_NS_MAGIC:
        raise CaptureError(f"{path}: not a little-endian nanosecond pcap (magic {magic:#x})")
    off, out = 24, []
    while off + 16 <= len(data):
        sec, nsec, incl, _ = struct.unpack("<IIII", data[off:off + 16])
        out.append((sec * 1_000_000_000 + nsec, data[off + 16:off + 16 + incl]))
        off += 16 + incl
    return out
