"""ovs-vswitchd's CPU per GB at a fixed rate (fathom.bench.datapath_cpu): thread kinds, CPU between
two readings of thread counters, per GB, and the judgement of modes against a baseline with its
noise floor."""
from __future__ import annotations

import os
import threading

import pytest

from fathom.bench import datapath_cpu as dc


def test_threads_are_kinded_by_their_names():
    assert dc.kind(100, 100, "ovs-vswitchd") == "main"
    assert [dc.kind(100, t, n) for t, n in ((101, "handler12"), (102, "revalidator13"), (103, "pmd-c00/id:4"),
                                            (104, "urcu3"))] == ["handler", "revalidator", "pmd", "other"]


def test_a_process_threads_are_read_from_proc():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="handler-like")
    t.start()
    try:
        got = dc.threads(os.getpid())
    finally:
        stop.set()
        t.join()
    assert got[os.getpid()][0] == "main" and got[os.getpid()][1] > 0
    assert len(got) >= 2 and all(k in dc.KINDS for k, _ in got.values())
    assert dc.threads(2 ** 22 + 1) == {}          # no such process: nothing, no error


def test_cpu_between_two_readings_by_switch_and_kind_and_per_gb():
    before = {"c1": {1: ("main", 1_000_000_000), 2: ("revalidator", 5_000_000)},
              "c2": {7: ("main", 0)}}
    after = {"c1": {1: ("main", 1_500_000_000), 2: ("revalidator", 7_000_000),
                    3: ("handler", 1_000_000)},           # started in the window: from zero
             "c2": {7: ("main", 250_000_000)}}
    cpu = dc.cpu_ms(before, after)
    assert cpu["by_switch"]["c1"] == pytest.approx({"main": 500, "pmd": 0, "handler": 1, "revalidator": 2, "other": 0})
    assert cpu["by_kind"]["main"] == pytest.approx(750) and cpu["total"] == pytest.approx(753)
    g = dc.per_gb(cpu, 250_000_000)                       # a quarter of a GB carried
    assert g["total"] == pytest.approx(3012) and g["by_kind"]["revalidator"] == pytest.approx(8)
    assert g["by_switch"]["c2"]["main"] == pytest.approx(1000)


def _runs(rows, control=lambda i: 1.0):
    """Runs whose switch s1 costs the row's value per GB and the control c `control(repeat)` times
    100 (the machine's load moving both alike)."""
    return [{"mode": m, "repeat": i, "rate_held": True,
             "cpu_ms_per_gb": {"by_switch": {"s1": {**dict.fromkeys(dc.KINDS, 0.0), "main": v * control(i)},
                                             "c": {**dict.fromkeys(dc.KINDS, 0.0), "main": 100 * control(i)}}}}
            for i, row in enumerate(rows) for m, v in row.items()]


def test_modes_are_judged_by_what_they_add_against_the_targets_budget_at_saturation():
    # off 1000 ms/GB; 1:100 adds 1 %, drops 5 %; saturated 800 ms/GB; the machine's load moves
    # every switch by up to 30 % from one repeat to the next: the control takes it out
    rows = [{"off": 1000, "every": 1010, "drops": 1050, "full": 800} for _ in range(6)]
    got = dc.compare(_runs(rows, lambda i: 1 + 0.3 * (i % 2)), "off", {"every": 0.97, "drops": 0.99}, "full",
                     ("s1",), "c")
    assert got["noise_floor"]["median"] == pytest.approx(0) and got["noise_floor"]["raw"]["median"] > 0.2
    assert got["saturated_ms_per_gb"] == pytest.approx(800 * 1.15) and got["rate_ms_per_gb"] == pytest.approx(1150)
    every, drops = got["modes"]["every"], got["modes"]["drops"]
    assert every["added_median"] == pytest.approx(11.5) and every["added_ci"][:2] == pytest.approx((11.5, 11.5))
    # 0.97 allows 920 * (1/0.97 - 1) = 28.5 ms/GB; 0.99 allows 9.3; drops add 57.5
    assert every["budget_ms_per_gb"] == pytest.approx(920 * (1 / 0.97 - 1)) and every["verdict"] == "shown"
    assert every["predicted_ratio"] == pytest.approx(920 / 931.5) and drops["verdict"] == "refuted"
    assert drops["predicted_ratio"] == pytest.approx(920 / 977.5) and every["resolves"] and drops["resolves"]
    assert got["controlled"]["drops"]["p50"] == pytest.approx(10.5)
    assert "| every | 1162 | 1010 | 1313 | 10.1000 | +12 |" in "\n".join(dc.markdown(got, "test"))


def test_a_noisy_baseline_resolves_nothing():
    rows = [{"off": v, "on": v, "full": 900} for v in (1000, 1100, 950, 1080, 990, 1120)]
    got = dc.compare(_runs(rows), "off", {"on": 0.99}, "full", ("s1",), "c")
    assert got["noise_floor"]["median_ms_per_gb"] > got["modes"]["on"]["budget_ms_per_gb"]
    assert got["modes"]["on"]["predicted_ratio"] == 1.0 and not got["modes"]["on"]["resolves"]
    assert got["modes"]["on"]["verdict"] == "not resolved (noise floor)"
    few = dc.compare(_runs([{"off": 1000, "on": 1001, "full": 900}] * 3), "off", {"on": 0.99}, "full", ("s1",), "c")
    assert few["modes"]["on"]["added_ci"] is None and few["modes"]["on"]["verdict"] == "not resolved (too few repeats)"
