"""The arithmetic of `fathom bench vtap` (fathom/bench/vtap.py): rows from the engine's report, per-run
ratios, per-repeat comparisons between modes and the copy's CPU cost. Pure Python, no lab."""
from __future__ import annotations

from fathom.bench.vtap import aggregate, ratios, tcp_sizes, udp_row


def engine_doc(sent=10000, received=10000, monitor=10000, achieved=10000.0, seconds=1.0):
    hist = {"p50_ns": 40000, "p99_ns": 90000}
    return {"tx": {"frames": sent, "offered": sent, "duration_s": seconds, "achieved_pps": achieved, "device_drops": 0},
            "rx": {"unique": received, "lost": sent - received, "loss_ratio": (sent - received) / sent},
            "monitor": {"unique": monitor, "duplicates": 0, "latency": hist}, "latency": hist}


def test_udp_row_cost_per_frame_only_without_loss():
    # 300 ms of vswitchd CPU in the run, of which 100 ms it would have used idle: 20 us for each of 10,000 frames
    r = udp_row(engine_doc(), 512, 10000, "fathom", cpu_ns=300_000_000, idle_ns=100_000_000)
    assert r["switch_us_per_frame"] == 20.0 and not r["saturated"] and not r["sender_limited"]
    assert r["monitor_over_receiver"] == 1.0 and r["receiver_mbps"] == round(10000 * 512 * 8 / 1e6, 2)
    lossy = udp_row(engine_doc(received=9000, monitor=8990), 512, 10000, "fathom", cpu_ns=300_000_000)
    assert lossy["saturated"] and lossy["switch_us_per_frame"] is None
    assert lossy["monitor_over_receiver"] == round(8990 / 9000, 4)
    # the sender did not offer the load: flagged, and no cost figure either
    slow = udp_row(engine_doc(achieved=9000.0), 512, 10000, "none", cpu_ns=1)
    assert slow["sender_limited"] and slow["switch_us_per_frame"] is None


def raw_rows():
    """Two repeats at one size and load; in repeat 1 everything ran slower (a busy machine)."""
    rows = []
    for rep, scale in ((0, 1.0), (1, 0.5)):
        for mode, frames, mon, cpu in (("none", 10000, 0, 10.0), ("fathom", 9000, 9000, 12.0),
                                       ("mirror", 9500, 9490, 12.5)):
            rows.append({"proto": "udp", "size_bytes": 64, "offered_pps": 10000.0, "mode": mode, "repeat": rep,
                         "receiver_frames": int(frames * scale), "receiver_mbps": frames * scale * 64 * 8 / 1e6,
                         "monitor_over_receiver": round(mon / frames, 4) if mode != "none" else 0.0,
                         "switch_us_per_frame": cpu * (1 + rep), "saturated": False, "sender_limited": False})
    return rows


def test_ratios_are_taken_within_a_repeat():
    (r,) = ratios(raw_rows())
    # 0.9 in both repeats although the absolute counts halved in the second
    assert r["fathom_over_none"] == 0.9 and r["fathom_over_none_min"] == r["fathom_over_none_max"] == 0.9
    assert r["mirror_over_none"] == 0.95
    assert r["fathom_over_mirror"] == round(9000 / 9500, 4)
    # the copy's cost: 2 us/frame in repeat 0 (12 - 10), 4 in repeat 1 (24 - 20)
    assert r["fathom_copy_us_per_frame"] == 3.0 and r["fathom_copy_us_per_frame_range"] == [2.0, 4.0]
    assert r["metric"] == "receiver_frames"


def test_aggregate_keeps_per_run_monitor_ratios_and_ranges():
    points = {p["mode"]: p for p in aggregate(raw_rows())}
    f = points["fathom"]
    assert f["n"] == 2 and f["monitor_over_receiver_per_run"] == [1.0, 1.0]
    m = points["mirror"]
    assert m["monitor_over_receiver_per_run"] == [round(9490 / 9500, 4)] * 2
    assert m["receiver_mbps_min"] < m["receiver_mbps"] < m["receiver_mbps_max"]
    assert [p["mode"] for p in aggregate(raw_rows())] == ["none", "fathom", "mirror"]


def test_saturated_runs_have_no_cost_and_are_counted():
    rows = raw_rows()
    rows[1]["saturated"], rows[1]["switch_us_per_frame"] = True, None  # repeat 0, fathom
    f = {p["mode"]: p for p in aggregate(rows)}["fathom"]
    assert f["saturated_runs"] == 1 and f["switch_us_per_frame"] == 24.0
    (r,) = ratios(rows)
    assert r["fathom_copy_us_per_frame"] == 4.0  # only repeat 1 has both figures


def test_tcp_sizes_respect_the_mss_floor():
    # frame = MSS + 70 (Ethernet, IPv4, TCP with timestamps, FCS); Linux's MSS floor is 88
    assert tcp_sizes((64, 128, 158, 256, 1518)) == [158, 256, 1518]
