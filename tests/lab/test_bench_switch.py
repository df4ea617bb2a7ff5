"""Lab tests of `fathom bench switch` (root, OVS, namespaces). Short runs: these check that the figures
are right, not how fast anything is. The runs use the prefix `bnsw` (namespaces bnsw-gen, -dut, -rcv;
overlay lab bnswov); every test leaves none of them behind, even on failure."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "bnsw"


@pytest.fixture(autouse=True)
def clean():
    from fathom.bench.devices import Names, cleanup
    from fathom.lab.lab import Lab
    cleanup(Names(PREFIX))
    yield
    cleanup(Names(PREFIX))
    lab = Lab(f"{PREFIX}ov")
    if lab.exists():
        lab.down()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(l.startswith((f"{PREFIX}-", f"{PREFIX}ov-")) for l in left.splitlines())


def bench(tmp_path, *args, expect=0):
    p = subprocess.run([sys.executable, "-m", "fathom.cli.main", "bench", "switch", "--quick", "--prefix", PREFIX,
                        "-o", str(tmp_path / "out"), "--json", *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert p.returncode == expect, p.stderr[-2000:]
    return json.loads(p.stdout) if expect == 0 else p


def test_calibration_floors_and_tx_stamp_check(tmp_path):
    doc = bench(tmp_path, "--module", "calibration", "--sizes", "64,512", "--device", "veth")
    rows = {(r["device"], r["frame_size_bytes"]): r for r in doc["results"]["calibration"]}
    assert set(rows) == {("veth", 64), ("veth", 512), ("redirect", 64), ("redirect", 512)}
    for (device, size), r in rows.items():
        assert r["loss_ratio"] == 0 and r["lost_at_device_input"] == 0
        assert r["latency_n"] >= 2000
        assert not r["generator_limited"]
        # to the receiving thread is later than the kernel RX stamp
        assert r["latency_socket_p50_ns"] > r["latency_p50_ns"]
    # the floors as docs/bench-switch.md states them, with room for the kernel build: direct veth p50 < 1 us
    # and p99 < 4 us; through the redirect device (a receive path) p50 < 6 us, and above the direct veth's
    for size in (64, 512):
        assert rows[("veth", size)]["latency_p50_ns"] < 1000, rows[("veth", size)]
        assert rows[("veth", size)]["latency_p99_ns"] < 4000, rows[("veth", size)]
        assert rows[("veth", size)]["latency_p50_ns"] < rows[("redirect", size)]["latency_p50_ns"] < 6000
    # TX stamps against the capture's own clock read: every frame stamped after its own capture and
    # before the next frame's, median below half the frame interval (100 us at 10 kpps)
    # (docs/bench-switch.md: p50 under 2 us on kernel build fc-v782, 7.5 us on fc-v669)
    (chk,) = doc["results"]["tx-stamp-check"]
    assert chk["matched"] >= 0.99 * chk["frames_sent"] and chk["negative"] == 0, chk
    assert chk["past_next_capture"] == 0 and 0 <= chk["min_ns"] and chk["p50_ns"] < 50_000, chk
    assert doc["results"]["calibration-throughput"][0]["throughput_pps"] > 50000
    out = tmp_path / "out"
    for f in ("results.json", "summary.md", "calibration.csv", "latency_vs_frame_size.png"):
        assert (out / f).exists(), f


def test_generator_against_trafgen(tmp_path):
    doc = bench(tmp_path, "--module", "generator", "--sizes", "64", "--gen-repeats", "1")
    runs = {r["tool"]: r for r in doc["results"]["generator"]}
    assert set(runs) == {"fathom-traffic", "trafgen"}
    for r in runs.values():
        assert r["frames_in_window"] > 10000 and r["pps"] > 10000 and r["cpu_s"] > 0, r
    # our own report of its rate is within 20 % of what the veth counted (different windows)
    ours = runs["fathom-traffic"]
    assert abs(ours["own_report_pps"] - ours["pps"]) < 0.2 * ours["pps"]
    (ratio,) = doc["results"]["generator-ratio"]
    assert ratio["ours_over_trafgen_median"] == pytest.approx(ours["pps"] / runs["trafgen"]["pps"], rel=1e-3)
    left = subprocess.run(["pgrep", "-f", "fathom-gen-"], capture_output=True, text=True).stdout
    assert not left.strip(), "a generator process outlived its run"


def test_rfc2544_throughput_is_confirmed_by_a_longer_trial(tmp_path):
    doc = bench(tmp_path, "--device", "linuxbridge", "--module", "throughput", "--sizes", "512",
                "--trial-s", "0.2", "--final-trial-s", "0.6", "--max-trials", "6")
    (r,) = doc["results"]["throughput"]
    finals = [t for t in r["search"] if t["final"]]
    assert finals and all(t["seconds"] == 0.6 for t in finals)
    assert all(t["seconds"] == 0.2 for t in r["search"] if not t["final"])
    assert r["confirmed"] is True and r["throughput_pps"] > 0
    assert "QUICK" in r["method"] and not r["rfc_trial_length"]


def test_device_dropping_every_tenth_frame_reports_ten_percent(tmp_path):
    doc = bench(tmp_path, "--device", "linuxbridge", "--drop-every", "10", "--module", "frame-size",
                "--sizes", "128")
    r = doc["results"]["frame-size"][0]
    assert r["frames_sent"] > 5000
    assert abs(r["loss_ratio"] - 0.10) <= 0.005, r
    assert r["duplicates"] == 0 and r["reordered"] == 0


def test_injected_reordering_and_duplicates_are_counted(tmp_path):
    doc = bench(tmp_path, "--device", "linuxbridge", "--inject-reorder", "50", "--inject-dup", "40",
                "--module", "frame-size", "--sizes", "128")
    r = doc["results"]["frame-size"][0]
    n = r["frames_sent"]
    assert r["reordered"] == len([s for s in range(0, n, 50) if s + 1 < n])
    assert r["duplicates"] == n // 40
    assert r["lost"] == 0


def test_flow_install_delay_for_each_flow(tmp_path):
    doc = bench(tmp_path, "--device", "ovs", "--module", "flow-install", "--module", "echo", "--flows", "20")
    rows = doc["results"]["flow-install"]
    fi = doc["extra"]["flow_install"]
    assert len(rows) == 20 and sorted(r["udp_dst"] for r in rows) == list(range(9000, 9020))
    # one clock: every flow_mod and the barrier reply were captured on the switch's loopback
    assert fi["flow_mods_captured"] == 20 and fi["barrier_reply_captured"]
    # probes below the device's zero-loss rate, measured first
    assert 0 < fi["probe_pps"] <= 0.5 * fi["zero_loss_pps"] + 1
    for r in rows:
        assert r["install_delay_ns"] is not None and 0 < r["install_delay_ns"] < 2e9, r
        # the lower bound (last probe not forwarded) is never above the upper bound (first forwarded)
        assert 0 <= r["active_after_ns"] <= r["install_delay_ns"], r
        assert r["flow_mod_seen_ns"] < r["barrier_reply_ns"]
        assert r["probes_lost_after_active"] is not None
    assert fi["probes_lost_after_active"] == sum(r["probes_lost_after_active"] for r in rows)
    # the resolution docs/bench-switch.md states: consecutive probes of one flow leave one probe interval
    # per flow apart, so the last probe not forwarded and the first forwarded bracket the activation;
    # a generator that lost the CPU for a moment widens one flow's bracket (its row shows by how much)
    interval = fi["probe_interval_per_flow_ns"]
    gaps = sorted(r["first_forwarded_tx_ns"] - (r["flow_mod_seen_ns"] + r["active_after_ns"])
                  for r in rows if r["active_after_ns"] > 0)
    assert not gaps or (gaps[0] > 0 and gaps[len(gaps) // 2] <= 2 * interval), (gaps, interval)
    assert doc["results"]["echo"][0]["n"] == 100
    assert (tmp_path / "out" / "flow_install_cdf.png").exists()


def test_action_delay_on_ovs_installs_each_action(tmp_path):
    doc = bench(tmp_path, "--device", "ovs", "--module", "action-delay", "--frames", "3000")
    rows = {r["action"]: r for r in doc["results"]["action-delay"]}
    assert set(rows) == {"forward", "vlan-push", "vlan-rewrite", "mac-rewrite"}
    for r in rows.values():
        assert r["frames_received"] == 3000 and r["loss_ratio"] == 0, r
    dumps = doc["extra"]["flow_dumps"]
    assert "push_vlan:0x8100" in dumps["ovs/vlan-push"]
    assert "set_field:4296->vlan_vid" in dumps["ovs/vlan-rewrite"]  # VID 200 | OFPVID_PRESENT
    assert "->eth_dst" in dumps["ovs/mac-rewrite"]


def test_unknown_device_is_a_clear_error(tmp_path):
    p = bench(tmp_path, "--device", "nosuch", expect=2)
    assert "unknown device 'nosuch'" in p.stderr and "ovs" in p.stderr


def test_frame_above_mtu_is_a_clear_error(tmp_path):
    p = bench(tmp_path, "--device", "veth", "--sizes", "2000", expect=2)
    assert "above the MTU" in p.stderr and "1518" in p.stderr


def test_unknown_module_is_a_clear_error(tmp_path):
    p = bench(tmp_path, "--module", "warp", expect=2)
    assert "unknown module 'warp'" in p.stderr


def test_overlay_vxlan_against_vlan(tmp_path):
    # short trials: the search's result is not asserted, only that both paths carry frames
    doc = bench(tmp_path, "--module", "overlay", "--sizes", "512", "--trial-s", "0.2", "--final-trial-s", "0.6",
                "--max-trials", "5")
    rows = {r["path"]: r for r in doc["results"]["overlay"]}
    assert set(rows) == {"vxlan", "vlan"}
    for r in rows.values():
        # both paths carry the frames; the loss-free rate is a measurement (on a slow VM even the search's
        # lowest trial may lose a frame), not a property of the path
        assert r["max_received_pps"] > 0 and r["throughput_pps"] >= 0 and r["trials"], r
    neigh = doc["extra"]["overlay"]["tnl_neigh_show_after"]
    # each node learned the other's tunnel address over ARP
    assert "198.18.61.11" in neigh["node1"] and "198.18.61.10" in neigh["node2"]
    assert doc["extra"]["overlay"]["method"].startswith("binary search")
    assert "tnl/neigh/show" in (tmp_path / "out" / "summary.md").read_text()
