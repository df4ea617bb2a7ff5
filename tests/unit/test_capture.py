"""fathom.lab.capture against the real tcpdump and tshark, in a namespace of its own (root): what is
sent while the capture runs is in the file, read back by tshark and by the nanosecond reader; a
capture that cannot start says why."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from fathom.host.exec import argv
from fathom.lab.capture import Capture, CaptureError, read_pcap_ns

@pytest.fixture
def ns():
    """A network namespace of its own (root needed: without it `ip netns add` fails, and so does the test)."""
    name = f"ou-cap-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(argv(["ip", "link", "set", "lo", "up"], name), check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def ping(ns: str, count: int) -> None:
    subprocess.run(argv(["ping", "-c", str(count), "-i", "0.05", "-W", "1", "127.0.0.1"], ns), check=True,
                   capture_output=True)


def test_what_is_sent_while_it_runs_is_in_the_file(ns, tmp_path):
    with Capture(ns, "lo", tmp_path / "lo.pcap", "icmp", nano=True) as cap:
        ping(ns, 3)
    assert cap.dropped == 0, cap.report
    # on loopback each echo is seen once, its reply once
    assert sorted(cap.fields("icmp.type", display="icmp")) == [("0",)] * 3 + [("8",)] * 3
    stamps = [ts for ts, _ in read_pcap_ns(cap.path)]
    assert len(stamps) == 6 and stamps == sorted(stamps)
    assert abs(stamps[0] - time.time_ns()) < 60 * 10**9     # the kernel's wall-clock stamps, in ns
    ping(ns, 1)                                              # after the block: not captured
    assert len(read_pcap_ns(cap.path)) == 6


def test_a_capture_that_cannot_start_says_why(ns, tmp_path):
    with pytest.raises(CaptureError, match="nosuchdev"):
        Capture(ns, "nosuchdev", tmp_path / "x.pcap").start()
