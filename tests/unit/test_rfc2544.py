"""The RFC 2544 throughput search (fathom/bench/rfc2544.py) against model devices: pure Python, no traffic."""
from __future__ import annotations

import pytest

from fathom.bench.rfc2544 import RFC_TRIAL_S, SearchPlan, search, summarize_repeats


class Model:
    """A device that forwards at most `capacity` frames/s, fed by a generator that reaches at most `tool`:
    a trial at rate r achieves min(r, tool) and loses the share of it above the capacity."""

    def __init__(self, capacity: float, tool: float = 1e9, long_trial_capacity: float | None = None):
        self.capacity, self.tool, self.long = capacity, tool, long_trial_capacity
        self.calls: list[tuple[float, float]] = []

    def __call__(self, rate: float, seconds: float) -> tuple[float, float]:
        self.calls.append((rate, seconds))
        achieved = min(rate, self.tool)
        cap = self.long if self.long is not None and seconds >= RFC_TRIAL_S else self.capacity
        return achieved, max(0.0, 1 - cap / achieved)


def test_converges_below_the_capacity_within_the_resolution():
    dev = Model(capacity=30000)
    res = search(dev, top_pps=400000, plan=SearchPlan(trial_s=2, final_s=60, resolution=0.02))
    assert 30000 * (1 - 0.02) <= res.throughput_pps <= 30000
    assert res.confirmed is True and not res.generator_limited
    # no trial above the capacity passed, every trial at or below it did
    assert all(t.passed == (t.offered_pps <= 30000) for t in res.trials)
    # the search used the short trials, the determination the RFC's full-length one
    assert [t.seconds for t in res.trials if not t.final] == [2] * (len(res.trials) - 1)
    assert [t.seconds for t in res.trials if t.final] == [60]


def test_first_trial_at_the_top_flags_a_device_as_fast_as_the_tool():
    dev = Model(capacity=1e9, tool=250000)
    res = search(dev, top_pps=260000, plan=SearchPlan(trial_s=1, final_s=0))
    assert res.generator_limited and res.confirmed is None
    assert res.throughput_pps == 250000  # what the generator achieved, not what was asked
    assert len(res.trials) == 1


def test_the_bracket_never_rises_above_what_the_generator_achieved():
    dev = Model(capacity=150000, tool=200000)
    res = search(dev, top_pps=500000, plan=SearchPlan(trial_s=1, final_s=0, resolution=0.01, max_trials=30))
    assert max(r for r, _ in dev.calls[1:]) <= 200000
    assert 150000 * 0.99 <= res.throughput_pps <= 150000


def test_a_failed_confirmation_steps_the_rate_down():
    # the device holds 100 kpps for short trials but only 80 kpps for 60 s ones
    dev = Model(capacity=100000, long_trial_capacity=80000)
    res = search(dev, top_pps=400000, plan=SearchPlan(trial_s=1, final_s=60, resolution=0.02, final_attempts=10))
    finals = [t for t in res.trials if t.final]
    assert res.confirmed is True and res.throughput_pps <= 80000
    assert [t.passed for t in finals][-1] and not any(t.passed for t in finals[:-1])
    assert all(b.offered_pps < a.offered_pps for a, b in zip(finals, finals[1:]))  # each attempt lower
    assert res.search_pps > 98000  # what the short trials alone would have claimed


def test_an_unconfirmable_rate_is_reported_as_such():
    dev = Model(capacity=100000, long_trial_capacity=1000)
    res = search(dev, top_pps=400000, plan=SearchPlan(trial_s=1, final_s=60, final_attempts=2))
    assert res.confirmed is False and res.throughput_pps == 0
    assert len([t for t in res.trials if t.final]) == 3


def test_every_confirming_trial_must_pass():
    calls = {"n": 0}

    def flaky(rate, seconds):  # the second of two confirming trials at each rate fails
        if seconds >= 60:
            calls["n"] += 1
            return rate, 0.01 if calls["n"] % 2 == 0 else 0.0
        return rate, 0.0 if rate <= 50000 else 0.2
    res = search(flaky, top_pps=100000, plan=SearchPlan(trial_s=1, final_s=60, final_trials=2, final_attempts=1))
    assert res.confirmed is False


def test_loss_tolerance_and_trial_cap():
    dev = Model(capacity=10000)
    res = search(dev, top_pps=1e6, plan=SearchPlan(trial_s=1, final_s=0, loss_tolerance=0.05, resolution=0.001,
                                                   max_trials=40))
    # 5 % loss is accepted: up to capacity / 0.95
    assert 10000 < res.throughput_pps <= 10000 / 0.95 + 1
    capped = search(Model(capacity=10000), top_pps=1e6, plan=SearchPlan(trial_s=1, final_s=0, max_trials=5,
                                                                         resolution=1e-9))
    assert len(capped.trials) == 5


def test_nothing_passes():
    res = search(Model(capacity=0.0001), top_pps=1000, plan=SearchPlan(trial_s=1, final_s=60, max_trials=6))
    assert res.throughput_pps == 0 and res.confirmed is None
    assert not any(t.final for t in res.trials)


def test_labels_say_whether_trials_have_the_rfc_length():
    assert "QUICK" in SearchPlan(trial_s=0.5, final_s=2).describe()
    assert SearchPlan(trial_s=5, final_s=60).rfc_trial_length
    assert "RFC 2544 trial length" in SearchPlan(trial_s=5, final_s=60).describe()
    with pytest.raises(ValueError):
        search(Model(1), top_pps=0, plan=SearchPlan())


def test_repeats_are_summarised_by_median_and_range():
    results = [search(Model(capacity=c), 1e6, SearchPlan(trial_s=1, final_s=0, resolution=0.001, max_trials=40))
               for c in (1000, 3000, 2000)]
    s = summarize_repeats([r.throughput_pps for r in results])
    assert s["repeats"] == 3
    assert s["min_pps"] < s["median_pps"] < s["max_pps"]
    assert 1990 < s["median_pps"] <= 2000
    assert summarize_repeats([])["median_pps"] is None
