"""Independent references for the engine's figures: tcpdump/tshark on the receiving veth count the same
frames, and the capture's nanosecond timestamps are the engine's kernel RX stamps, frame by frame.
Also OVS's own flow counters against the engine's count."""
from __future__ import annotations

import csv
import os
import signal
import struct
import subprocess
import time

import pytest

from fathom.bench.devices import LinuxBridgeDevice, OvsDevice, cleanup
from fathom.bench.engine import engine_args, run_engine

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


@pytest.fixture(autouse=True)
def clean():
    cleanup()
    yield
    cleanup()


def read_pcap_ns(path):
    """(timestamp_ns, frame) of each record of a nanosecond pcap file."""
    data = open(path, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    assert magic == 0xA1B23C4D, "expected a nanosecond pcap (tcpdump --time-stamp-precision=nano)"
    off, out = 24, []
    while off + 16 <= len(data):
        sec, nsec, incl, _ = struct.unpack("<IIII", data[off:off + 16])
        out.append((sec * 1_000_000_000 + nsec, data[off + 16:off + 16 + incl]))
        off += 16 + incl
    return out


def test_capture_agrees_with_engine_on_counts_and_rx_stamps(tmp_path):
    dev = LinuxBridgeDevice()
    dev.setup()
    try:
        dev.drop_every(10)
        pcap, frames_csv = tmp_path / "r0.pcap", tmp_path / "frames.csv"
        cap = subprocess.Popen(["ip", "netns", "exec", dev.rx.ns, "tcpdump", "-i", dev.rx.ifname, "-n", "-Q", "in",
                                "--time-stamp-precision=nano", "-w", str(pcap), "udp and src port 4242"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)
        r = run_engine(engine_args(dev.tx, dev.rx, size=128, rate_pps=10000, count=5000, dst_mac=dev.rx.mac,
                                   csv=str(frames_csv)))
        time.sleep(0.3)
        cap.send_signal(signal.SIGINT)
        cap.wait(10)
    finally:
        dev.teardown()
    assert r["rx"]["unique"] == 4500 and r["rx"]["lost"] == 500
    # tshark counts the frames on its own
    n = subprocess.run(["tshark", "-r", str(pcap), "-Y", "udp.srcport == 4242"], capture_output=True,
                       text=True).stdout.count("\n")
    assert n == r["rx"]["frames"] == 4500
    # each captured frame's timestamp is the engine's RX stamp for that sequence number
    rx = {int(row["seq"]): int(row["rx_kernel_ns"]) for row in csv.DictReader(open(frames_csv))}
    cap_frames = read_pcap_ns(pcap)
    assert len(cap_frames) == 4500
    same = sum(1 for ts, f in cap_frames if rx[int.from_bytes(f[46:50], "big")] == ts)
    assert same == 4500
    # and the dropped ones are every 10th: 500 of them, all in one residue class mod 10
    dropped = [s for s, t in rx.items() if not t]
    assert len(dropped) == 500 and len({s % 10 for s in dropped}) == 1


def test_ovs_flow_counter_agrees_with_engine(tmp_path):
    dev = OvsDevice()
    dev.setup()
    try:
        dev.forward()
        r = run_engine(engine_args(dev.tx, dev.rx, size=64, rate_pps=5000, count=3000, dst_mac=dev.rx.mac))
        time.sleep(1.5)  # the datapath's flow statistics reach OpenFlow about once a second
        dump = dev.dump_flows()
    finally:
        dev.teardown()
    n_packets = int(dump.split("n_packets=")[1].split(",")[0])
    assert r["rx"]["unique"] == 3000
    assert n_packets == 3000, dump
