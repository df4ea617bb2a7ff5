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
        return {"packets": 1000, "passes_per_packet": passes, "upcalls": 2, "vswitchd_cpu_us_per_packet": 5.0}
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
    assert doc["modes"] == {"none": 0, "sg1": 2, "sg100": 100}
    text = sb.markdown(doc)
    assert "| same_node | tcp_gbps | 2.00 | 1.80 | 1.62 | 0.90 | 0.90 | 0.81 |" in text
    assert "| cross_node | connections | 1.00 · 3.00 · 3.00 | 2 · 2 · 2 | 5.0 · 5.0 · 5.0 |" in text
    assert "NOT met" in text


def test_summary_meets_target_and_survives_a_zero():
    doc = sb.summary(_samples({"none": 1.0, "sg1": 1.0, "sg100": 0.95}), {"repeats": 2})
    assert doc["meets_target"] is True
    doc = sb.summary(_samples({"none": 0.0, "sg1": 1.0, "sg100": 1.0}), {"repeats": 2})
    assert doc["ratios"]["sg100_over_none"]["same_node"]["tcp_gbps"] is None
    assert doc["meets_target"] is False
    assert "| – |" in sb.markdown(doc)
