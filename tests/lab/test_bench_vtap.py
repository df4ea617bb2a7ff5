"""Lab test of `fathom bench vtap` (lab bnvb, under its controller): short runs that check what the
benchmark counts, not how fast anything is. Below saturation every frame reaches the receiver in every
mode; the monitor gets a copy of each with the tap and with mirroring, none without; a failed run stops
the benchmark instead of becoming a zero point."""
from __future__ import annotations

import os

import pytest

from fathom.bench.engine import BenchError
from fathom.bench.vtap import Params, VtapBench, aggregate, ratios

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


@pytest.fixture(scope="module")
def bench():
    b = VtapBench(Params(seconds=1.0, sizes=(256,), loads_pps=(2000,), repeats=1, protos=("udp",)), lab="bnvb",
                  progress=lambda msg: None)
    try:
        b.up()
        yield b
    finally:
        b.down()


def test_copies_counted_per_frame_in_each_mode(bench):
    result = bench.sweep()
    runs = {r["mode"]: r for r in result["raw"]}
    assert set(runs) == {"none", "fathom", "mirror"}
    for mode, r in runs.items():
        assert r["sent"] == 2000 and not r["sender_limited"], r
        assert r["receiver_frames"] == 2000 and r["receiver_lost"] == 0, r
        # the monitor gets exactly one copy of each frame with a tap or a mirror, nothing without
        assert r["monitor_frames"] == (0 if mode == "none" else 2000), r
        assert r["monitor_duplicates"] == 0
        assert r["switch_cpu_ms"] > 0 and r["switch_us_per_frame"] is not None
    assert runs["fathom"]["monitor_over_receiver"] == runs["mirror"]["monitor_over_receiver"] == 1.0
    (ratio,) = ratios(result["raw"])
    assert ratio["fathom_over_none"] == ratio["mirror_over_none"] == 1.0
    assert [p["n"] for p in aggregate(result["raw"])] == [1, 1, 1]


def test_a_failed_run_raises(bench):
    bench.set_mode("none")
    with pytest.raises(BenchError, match="MTU"):
        bench.run_udp(9000, 1000, "none")  # larger than the VM's MTU: the engine refuses, no zero point
