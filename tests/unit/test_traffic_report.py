"""Unit tests of the Python side of the switch benchmark: rate conversions, statistics, argument checks,
the flow-install and generator arithmetic, the OpenFlow capture reader and the report writer (no root,
no traffic)."""
from __future__ import annotations

import json
import struct

import pytest

from fathom.bench import generator
from fathom.bench.devices import Names
from fathom.bench.engine import BenchError
from fathom.bench.ofstream import OfMessage, openflow_messages
from fathom.bench.switch import (OFPT_BARRIER_REPLY, OFPT_FLOW_MOD, Plan, SwitchBench, flow_install_rows, mbps_for,
                                 pps_for, row_from, summarize)
from fathom.lab.capture import read_pcap_ns


def test_rate_conversions_count_the_layer1_overhead():
    # 64-byte frames at 10 Gb/s: 14.88 Mpps (20 bytes of preamble + gap per frame)
    assert round(pps_for(10000, 64)) == 14880952
    assert mbps_for(pps_for(123.4, 150), 150) == pytest.approx(123.4)


def test_summarize_uses_the_one_percentile():
    # fathom.stats.percentile: linear interpolation between closest ranks
    s = summarize(list(range(1, 1001)))
    assert (s["n"], s["min_ns"], s["p50_ns"], s["p99_ns"], s["p999_ns"], s["max_ns"]) == (1000, 1, 500.5, 990.0, 999.0, 1000)
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
    with pytest.raises(BenchError, match="--prefix"):
        Names("Bad-Prefix")


def test_plans_say_whether_their_rfc2544_trials_have_the_rfc_length():
    full, quick = Plan.make(False, 1500), Plan.make(True, 1500)
    assert full.search.final_s == 60 and full.search.rfc_trial_length
    assert not quick.search.rfc_trial_length and "QUICK" in quick.to_dict()["search"]["describe"]


def _engine_doc(offered, achieved, loss=0.0):
    lat = {"n": 10, "min_ns": 100, "mean_ns": 120.0, "std_ns": 5.0, "p50_ns": 118, "p90_ns": 125, "p99_ns": 140,
           "p999_ns": 150, "max_ns": 160}
    return {"timestamp_source": "kernel software (SO_TIMESTAMPING)",
            "config": {"frame_size_bytes": 150, "target_pps": offered},
            "tx": {"frames": 1000, "achieved_pps": achieved, "if_tx_dropped": 40, "lateness": {"p99_ns": 10},
                   "gap": {"p50_ns": 1, "p99_ns": 2}},
            "rx": {"unique": 900, "lost": 100, "loss_ratio": loss, "lost_at_device_input": 40, "duplicates": 0,
                   "reordered": 0, "seq_gaps": 3, "rx_pps": achieved}, "latency": lat, "latency_socket": lat}


def test_generator_limited_flag_and_drops_at_the_device_input():
    assert not row_from(_engine_doc(10000, 9990))["generator_limited"]
    row = row_from(_engine_doc(10000, 9000))
    assert row["generator_limited"]
    assert (row["lost"], row["lost_at_device_input"], row["if_tx_dropped"]) == (100, 40, 40)


def _frames(n_flows, per_flow, active_from, lost_after=(), t0=1_000_000_000, gap=100_000):
    """Engine CSV rows: probe seq s of flow s % n_flows leaves at t0 + s*gap and, once its flow is active
    (from probe index active_from[flow] of that flow), arrives 50 us later, unless listed in lost_after."""
    rows = []
    for s in range(n_flows * per_flow):
        flow, k = s % n_flows, s // n_flows
        tx = t0 + s * gap
        arrived = k >= active_from[flow] and s not in lost_after
        rows.append({"seq": str(s), "tx_kernel_ns": str(tx), "rx_kernel_ns": str(tx + 50_000 if arrived else 0),
                     "arrivals": "1" if arrived else "0"})
    return rows


def test_flow_install_delays_bounds_and_probes_lost():
    # 2 flows, 10 probes each, one probe every 100 us (each flow every 200 us); flow_mods reach the switch at
    # 1.0003 s (flow 0) and 1.0005 s (flow 1); flow 0 forwards from its 3rd probe, flow 1 from its 5th
    t0 = 1_000_000_000
    msgs = [OfMessage(t0 + 300_000, True, 5, OFPT_FLOW_MOD, 7, 80), OfMessage(t0 + 500_000, True, 5, OFPT_FLOW_MOD, 8, 80),
            OfMessage(t0 + 900_000, False, 5, OFPT_BARRIER_REPLY, 9, 8)]
    frames = _frames(2, 10, active_from=[2, 4], lost_after={10})  # seq 10: flow 0's 6th probe, lost after activation
    rows, summary = flow_install_rows("ovs", 2, [7, 8], 9, msgs, frames)
    r0, r1 = rows
    # flow 0: first forwarded probe seq 4 (tx t0+400 us, rx +50 us); last not forwarded seq 2 left at t0+200 us,
    # before its flow_mod: the lower bound is 0
    assert r0["install_delay_ns"] == 400_000 + 50_000 - 300_000
    assert r0["active_after_ns"] == 0
    # flow 1: first forwarded seq 9 (tx t0+900 us); seq 7 (tx t0+700 us) was not forwarded after its flow_mod
    assert r1["install_delay_ns"] == 900_000 + 50_000 - 500_000
    assert r1["active_after_ns"] == 700_000 - 500_000
    assert (r0["probes_lost_after_active"], r1["probes_lost_after_active"]) == (1, 0)
    assert (r0["active_before_barrier"], r1["active_before_barrier"]) == (True, False)
    assert summary["probes_lost_after_active"] == 1 and summary["probes_dropped_before_active"] == 2 + 4
    assert summary["barrier_delay_ns"] == 600_000 and summary["flow_mods_captured"] == 2
    assert summary["flows_never_forwarded"] == 0


def _pcap(records):
    out = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)
    for ts, frame in records:
        out += struct.pack("<IIII", ts // 1_000_000_000, ts % 1_000_000_000, len(frame), len(frame)) + frame
    return out


def _tcp_frame(sport, dport, seq, payload):
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, 0x18, 65535, 0, 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0, bytes([127, 0, 0, 1]),
                     bytes([127, 0, 0, 1]))
    return bytes(12) + b"\x08\x00" + ip + tcp


def test_openflow_messages_are_reassembled_across_segments(tmp_path):
    fm = struct.pack("!BBHI", 5, OFPT_FLOW_MOD, 16, 41) + bytes(8)
    fm2 = struct.pack("!BBHI", 5, OFPT_FLOW_MOD, 12, 42) + bytes(4)
    reply = struct.pack("!BBHI", 5, OFPT_BARRIER_REPLY, 8, 43)
    # the controller listens on 6653: what it sends goes to the switch
    segs = [(100, _tcp_frame(6653, 40000, 1000, fm + fm2[:5])),   # one whole message and the start of the next
            (150, _tcp_frame(6653, 40000, 1000, fm + fm2[:5])),   # the same segment seen twice (retransmission)
            (200, _tcp_frame(6653, 40000, 1021, fm2[5:])),        # the rest of the second
            (300, _tcp_frame(40000, 6653, 5000, reply))]
    path = tmp_path / "lo.pcap"
    path.write_bytes(_pcap(segs))
    msgs = openflow_messages(read_pcap_ns(path))
    assert [(m.type, m.xid, m.seen_ns, m.to_switch) for m in msgs] == [
        (OFPT_FLOW_MOD, 41, 100, True), (OFPT_FLOW_MOD, 42, 200, True), (OFPT_BARRIER_REPLY, 43, 300, False)]


def test_generator_ratios_are_paired_per_repeat():
    def row(tool, rep, pps, per_cpu):
        return {"tool": tool, "frame_size_bytes": 64, "repeat": rep, "pps": pps, "frames_per_cpu_s": per_cpu}
    rows = [row("fathom-traffic", 0, 600_000, 900_000), row("trafgen", 0, 800_000, 1_000_000),
            row("trafgen", 1, 400_000, 1_000_000), row("fathom-traffic", 1, 400_000, 800_000),
            row("fathom-traffic", 2, 900_000, 950_000), row("trafgen", 2, 1_000_000, 1_000_000)]
    (r,) = generator.ratios(rows)
    assert r["ours_over_trafgen_per_repeat"] == [0.75, 1.0, 0.9]
    assert (r["ours_over_trafgen_median"], r["ours_over_trafgen_min"], r["ours_over_trafgen_max"]) == (0.9, 0.75, 1.0)
    assert r["per_cpu_ours_over_trafgen_per_repeat"] == [0.9, 0.8, 0.95]
    assert r["per_cpu_ours_over_trafgen_median"] == 0.9
    # a ratio of medians would say 600/800 = 0.75: the paired one does not mix repeats
    assert (r["ours_pps_median"], r["trafgen_pps_median"]) == (600_000, 800_000)


def test_trafgen_frame_is_the_engines_template():
    f = generator.frame_bytes(64, "02:00:00:00:00:02", "02:00:00:00:00:01")
    assert len(f) == 60
    assert f[:12] == bytes.fromhex("020000000002020000000001") and f[12:14] == b"\x08\x00"
    assert f[23] == 17 and struct.unpack("!HH", f[34:38]) == (4242, 9000) and f[42:46] == bytes.fromhex("be9be955")
    # a valid IPv4 header checksum
    s = sum(struct.unpack("!10H", f[14:34]))
    assert (s & 0xFFFF) + (s >> 16) == 0xFFFF
    assert generator.trafgen_config(f).startswith("{ 0x02, ")


def test_report_writes_json_csv_markdown_and_plots(tmp_path):
    from fathom.bench import report
    rows = [{**row_from(_engine_doc(pps_for(m, 150), pps_for(m, 150), 0.01 * i)), "module": "load", "device": "ovs"}
            for i, m in enumerate((10, 50, 100))]
    fi, summary = flow_install_rows("ovs", 2, [7, 8], 9, [OfMessage(1_000_300_000, True, 5, OFPT_FLOW_MOD, 7, 80)],
                                    _frames(2, 10, active_from=[2, 4]))
    act = {"loadavg": [3.0, 2.0, 1.0], "netns_total": 40, "foreign_ovs_vswitchd": 5,
           "busiest_processes_cpu_pct": [["ovs-vswitchd", 40]]}
    env = {"date_utc": "x", "kernel": "k", "cpus": 2, "cpu_model": "cpu", "clocksource": "tsc", "ovs_version": "ovs",
           "os_ken_version": "4", "timestamping": "sw", "machine_at_start": act, "machine_at_end": act,
           "contended": report.busy([act])}
    doc = {"command": "fathom bench switch", "plan": Plan.make(True, 1500).to_dict(), "environment": env,
           "elapsed_s": 1.0, "results": {"load": rows, "flow-install": fi},
           "extra": {"flow_install": {**summary, "probe_pps": 5000, "zero_loss_pps": 10000}}}
    report.write(tmp_path, doc)
    for f in ("results.json", "summary.md", "load.csv", "flow-install.csv", "latency_loss_vs_load.png",
              "flow_install_cdf.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    md = (tmp_path / "summary.md").read_text()
    assert "Latency and loss against offered load" in md and "Flow-install delay" in md
    assert "QUICK" in md and "busy machine" in md and "5 other ovs-vswitchd" in md
    assert json.loads((tmp_path / "results.json").read_text())["plots"]
    assert (tmp_path / "load.csv").read_text().count("\n") == 4
