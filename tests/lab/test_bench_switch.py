"""Lab tests of `fathom bench switch` (root, OVS, namespaces). Short runs: these check that the figures
are right, not how fast anything is. Every test leaves no `sb-*` namespace behind, even on failure."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean():
    from fathom.bench.devices import cleanup
    from fathom.lab.lab import Lab
    cleanup()
    yield
    cleanup()
    lab = Lab("sbov")
    if lab.exists():
        lab.down()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(l.startswith(("sb-", "sbov-")) for l in left.splitlines())


def bench(tmp_path, *args, expect=0):
    p = subprocess.run([sys.executable, "-m", "fathom.cli.main", "bench", "switch", "--quick", "-o",
                        str(tmp_path / "out"), "--json", *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert p.returncode == expect, p.stderr[-2000:]
    return json.loads(p.stdout) if expect == 0 else p


def test_calibration_floor_on_direct_veth(tmp_path):
    doc = bench(tmp_path, "--module", "calibration", "--sizes", "64,512", "--device", "veth")
    rows = doc["results"]["calibration"]
    assert [r["frame_size_bytes"] for r in rows] == [64, 512]
    for r in rows:
        assert r["loss_ratio"] == 0
        assert r["latency_n"] >= 2000
        assert r["latency_p99_ns"] < 5000, r  # the floor of the measuring system
        assert not r["generator_limited"]
    assert doc["results"]["calibration-throughput"][0]["throughput_pps"] > 50000
    out = tmp_path / "out"
    for f in ("results.json", "summary.md", "calibration.csv", "latency_vs_frame_size.png"):
        assert (out / f).exists(), f


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
    assert len(rows) == 20
    for r in rows:
        assert r["install_delay_ns"] is not None and 0 < r["install_delay_ns"] < 2e9, r
        assert r["barrier_delay_ns"] > 0
    assert sorted(r["udp_dst"] for r in rows) == list(range(9000, 9020))
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
    doc = bench(tmp_path, "--module", "overlay", "--sizes", "512")
    rows = {r["path"]: r for r in doc["results"]["overlay"]}
    assert set(rows) == {"vxlan", "vlan"}
    for r in rows.values():
        assert r["throughput_pps"] > 0 and r["max_received_pps"] > 0
    neigh = doc["extra"]["overlay"]["tnl_neigh_show_after"]
    # each node learned the other's tunnel address over ARP
    assert "198.18.61.11" in neigh["node1"] and "198.18.61.10" in neigh["node2"]
    assert "tnl/neigh/show" in (tmp_path / "out" / "summary.md").read_text()
