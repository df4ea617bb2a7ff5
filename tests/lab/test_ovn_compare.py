"""Lab test of `fathom bench ovn-compare` (labs ovtf and ovto): one short run of both systems on the
same lab shape. It checks that the benchmark measures what it says, not how fast anything is: both
systems carry TCP on both paths, both report each new port up and pass its first echo in every plug
order, each system's control plane is the processes it names, and both labs are gone afterwards."""
from __future__ import annotations


import pytest

from fathom.bench.ovncompare import ORDERS, PATHS, Bench
from fathom.lab.lab import Lab

pytestmark = pytest.mark.lab   # needs root: without it the lab cannot come up and the test fails


@pytest.fixture(scope="module")
def doc():
    return Bench(prefix="ovt", repeats=1, ports=1, seconds=2, rest_s=0, large=False).run()


def test_both_systems_carry_traffic(doc):
    assert doc["traffic_check"] == {s: {p: True for p in PATHS} for s in ("fathom", "ovn")}
    for system, paths in doc["throughput"].items():
        for path, d in paths.items():
            assert d["n"] == 1 and d["min"] > 0.01, (system, path, d)   # iperf3 moved data


def test_both_filter_the_vms_traffic_statefully(doc):
    # both run the default security group on every VM port: its traffic is in conntrack on both
    assert doc["conntrack"]["fathom"] > 0 and doc["conntrack"]["ovn"] > 0, doc["conntrack"]


def test_both_report_each_port_up_and_pass_its_first_echo(doc):
    port_up = doc["tenants"]["4"]["port_up"]
    for system in ("fathom", "ovn"):
        for order in ORDERS:
            (run,) = port_up[system][order]["runs"]
            assert run["t_up"] is not None, (system, order, run)
            assert run["t_echo"] is not None, (system, order, run)
            assert run["t_api"] <= run["t_api_done"] and run["t_plug"] <= run["t_plug_done"]
            # the plug order happened as stated
            if order == "plug_first":
                assert run["t_plug_done"] <= run["t_api"]
            else:
                assert run["t_api_done"] <= run["t_plug"]
            if order == "api_plug_500ms":
                assert run["t_plug"] - run["t_api_done"] >= 0.5
            # no echo can come back before the VIF is on the switch
            assert run["t_echo"] > run["t_plug"]
            after = port_up[system][order]["echo_after_up_ms"]
            assert after["n"] == 1 and after["p50"] == pytest.approx((run["t_echo"] - run["t_up"]) * 1000)
    # OVN sets `up` only once its chassis has claimed the VIF and installed its flows
    assert all(port_up["ovn"][o]["up_before_vif"] == 0 for o in ORDERS)


def test_control_planes_and_flows_are_each_systems_own(doc):
    snap = doc["tenants"]["4"]["snapshot"]
    assert set(snap["fathom"]["rss"]["control_plane"]["by_process_mb"]) >= {"fathom-controller"}
    assert set(snap["ovn"]["rss"]["control_plane"]["by_process_mb"]) == {
        "ovsdb-server-nb", "ovsdb-server-sb", "ovn-northd", "ovn-controller-c1", "ovn-controller-c2", "ovn-controller-gw"}
    for system in ("fathom", "ovn"):
        assert all(mb > 1 for mb in snap[system]["rss"]["control_plane"]["by_process_mb"].values())
        assert snap[system]["flows"]["c1"]["br-int"] > 10 and snap[system]["flows"]["c2"]["br-int"] > 10


def test_labs_removed(doc):
    assert not Lab("ovtf").exists() and not Lab("ovto").exists()
