"""fathom bench secgroups: the groups it builds and how it turns samples into ratios and a summary."""
from fathom.bench import secgroups as sb


def test_groups_admit_the_bench_traffic_with_one_ingress_rule():
    for n in sb.GROUPS.values():
        rules = sb.group_rules(n)
        assert len(rules) == n
        admitting = [r for r in rules if r["direction"] == "ingress" and "remote_ip_prefix" not in r]
        assert admitting == [{"direction": "ingress", "protocol": "tcp", "port_range_min": sb.CONN_PORT}]
        assert [r for r in rules if r["direction"] == "egress"] == [{"direction": "egress"}]
        # the other rules name other ports and prefixes outside the lab's 198.19.41.0/24
        others = [r for r in rules if "remote_ip_prefix" in r]
        assert all(r["port_range_min"] != sb.CONN_PORT and r["remote_ip_prefix"].startswith("10.") for r in others)
        assert len({(r["protocol"], r["port_range_min"], r["remote_ip_prefix"]) for r in others}) == len(others)


def _samples(scale: dict) -> dict:
    def dp(passes):
        return {"packets": 1000, "passes_per_packet": passes, "upcalls": 2, "emc_hit_share": 0.5,
                "subtables_per_megaflow_hit": 1.5, "vswitchd_cpu_us_per_packet": 5.0}
    return {m: {p: {"tcp_gbps": [2.0 * scale[m], 2.0 * scale[m]],
                    "tcp_datapath": [dp(1 if m == "none" else 3)] * 2,
                    "connections_per_second": [1000 * scale[m]] * 2, "connections_failed": [0, 0],
                    "connections_datapath": [dp(1 if m == "none" else 3)] * 2}
                for p in sb.PATHS} for m in sb.MODES}


def test_summary_separates_conntrack_from_rules():
    doc = sb.summary(_samples({"none": 1.0, "sg1": 0.9, "sg100": 0.81}), {"repeats": 2})
    r = doc["ratios"]
    for p in sb.PATHS:
        for k in sb.FIGURES:
            assert abs(r["sg1_over_none"][p][k] - 0.9) < 1e-9
            assert abs(r["sg100_over_sg1"][p][k] - 0.9) < 1e-9
            assert abs(r["sg100_over_none"][p][k] - 0.81) < 1e-9
    assert doc["meets_target"] is False
    assert doc["results"]["sg1"]["same_node"]["tcp_datapath"]["passes_per_packet"]["p50"] == 3
    assert doc["rules"] == {"none": 0, "sg1": 2, "sg100": 100}
    text = sb.markdown(doc)
    assert "| same_node | tcp_gbps | 2.00 | 1.80 | 1.62 | 0.90 | 0.90 | 0.81 |" in text
    assert ("| cross_node | connections | 1.00 · 3.00 · 3.00 | 2 · 2 · 2 | 0.50 · 0.50 · 0.50 | 1.50 · 1.50 · 1.50 "
            "| 5.0 · 5.0 · 5.0 |") in text
    assert "NOT met" in text


def test_summary_meets_target_and_survives_a_zero():
    doc = sb.summary(_samples({"none": 1.0, "sg1": 1.0, "sg100": 0.95}), {"repeats": 2})
    assert doc["meets_target"] is True
    doc = sb.summary(_samples({"none": 0.0, "sg1": 1.0, "sg100": 1.0}), {"repeats": 2})
    assert doc["ratios"]["sg100_over_none"]["same_node"]["tcp_gbps"] is None
    assert doc["meets_target"] is False
    assert "| – |" in sb.markdown(doc)


PMD_STATS = """pmd thread numa_id 0 core_id 1:
  packets received: 100
  packet recirculations: 200
  avg. datapath passes per packet: 3.00
  emc hits: 250
  smc hits: 0
  megaflow hits: 48
  avg. subtable lookups per megaflow hit: 2.50
  miss with success upcall: 2
  miss with failed upcall: 0
main thread:
  packets received: 10
  packet recirculations: 0
  avg. datapath passes per packet: 1.00
  emc hits: 8
  megaflow hits: 2
  avg. subtable lookups per megaflow hit: 1.00
  miss with success upcall: 0
  miss with failed upcall: 1
  avg. packets per output batch: 20.01
"""


def test_pmd_stats_sums_threads():
    s = sb.pmd_stats(PMD_STATS)
    assert s["packets"] == 110 and s["recirculations"] == 200 and s["emc_hits"] == 258
    assert s["megaflow_hits"] == 50 and s["upcalls"] == 2 and s["failed_upcalls"] == 1
    assert s["subtable_lookups"] == 48 * 2.5 + 2 * 1.0
