"""Unit tests of the Python side of the switch benchmark: rate conversions, statistics, argument checks
and the report writer (no root, no traffic)."""
from __future__ import annotations

import json

import pytest

from fathom.bench.engine import BenchError
from fathom.bench.switch import Plan, SwitchBench, mbps_for, pps_for, row_from, summarize


def test_rate_conversions_count_the_layer1_overhead():
    # 64-byte frames at 10 Gb/s: 14.88 Mpps (20 bytes of preamble + gap per frame)
    assert round(pps_for(10000, 64)) == 14880952
    assert mbps_for(pps_for(123.4, 150), 150) == pytest.approx(123.4)


def test_summarize_uses_nearest_rank():
    s = summarize(list(range(1, 1001)))
    assert (s["n"], s["min_ns"], s["p50_ns"], s["p99_ns"], s["p999_ns"], s["max_ns"]) == (1000, 1, 500, 990, 999, 1000)
    assert s["mean_ns"] == 500.5
    assert summarize([])["n"] == 0


def test_bad_arguments_are_refused_before_anything_is_built():
    plan = Plan.make(True, 1500)
    with pytest.raises(BenchError, match="unknown device 'nope'"):
        SwitchBench(plan, ["nope"], ["frame-size"])
    with pytest.raises(BenchError, match="unknown module"):
        SwitchBench(plan, ["ovs"], ["warp"])
    with pytest.raises(BenchError, match="above the MTU.*1518"):
        SwitchBench(Plan.make(True, 1500, [64, 2000]), ["ovs"], ["frame-size"])
    # a jumbo MTU allows it, and the plan adds the jumbo size by itself
    assert 9018 in Plan.make(False, 9000).sizes
    SwitchBench(Plan.make(True, 9000, [64, 2000]), ["ovs"], ["frame-size"], mtu=9000)


def _engine_doc(offered, achieved, loss=0.0):
    lat = {"n": 10, "min_ns": 100, "mean_ns": 120.0, "std_ns": 5.0, "p50_ns": 118, "p90_ns": 125, "p99_ns": 140,
           "p999_ns": 150, "max_ns": 160}
    return {"timestamp_source": "kernel software (SO_TIMESTAMPING)",
            "config": {"frame_size_bytes": 150, "target_pps": offered},
            "tx": {"frames": 1000, "achieved_pps": achieved, "lateness": {"p99_ns": 10}, "gap": {"p50_ns": 1, "p99_ns": 2}},
            "rx": {"unique": 900, "lost": 100, "loss_ratio": loss, "duplicates": 0, "reordered": 0, "seq_gaps": 3,
                   "rx_pps": achieved}, "latency": lat}


def test_generator_limited_flag():
    assert not row_from(_engine_doc(10000, 9990))["generator_limited"]
    assert row_from(_engine_doc(10000, 9000))["generator_limited"]


def test_report_writes_json_csv_markdown_and_plots(tmp_path):
    from fathom.bench import report
    rows = [{**row_from(_engine_doc(pps_for(m, 150), pps_for(m, 150), 0.01 * i)), "module": "load", "device": "ovs"}
            for i, m in enumerate((10, 50, 100))]
    fi = [{"module": "flow-install", "device": "ovs", "flow": i, "udp_dst": 9000 + i, "install_delay_ns": 1e6 * (i + 1),
           "barrier_delay_ns": 2.5e6, "active_before_barrier": i < 2} for i in range(5)]
    env = {"date_utc": "x", "kernel": "k", "cpus": 2, "cpu_model": "cpu", "clocksource": "tsc", "ovs_version": "ovs",
           "os_ken_version": "4", "timestamping": "sw", "loadavg_at_start": [0, 0, 0], "loadavg_at_end": [0, 0, 0]}
    doc = {"command": "fathom bench switch", "plan": {"quick": True}, "environment": env, "elapsed_s": 1.0,
           "results": {"load": rows, "flow-install": fi}, "extra": {"flow_install": {"flows": 5, "probe_pps": 5000}}}
    report.write(tmp_path, doc)
    for f in ("results.json", "summary.md", "load.csv", "flow-install.csv", "latency_loss_vs_load.png",
              "flow_install_cdf.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    md = (tmp_path / "summary.md").read_text()
    assert "Latency and loss against offered load" in md and "Flow-install delay" in md
    assert json.loads((tmp_path / "results.json").read_text())["plots"]
    assert (tmp_path / "load.csv").read_text().count("\n") == 4
