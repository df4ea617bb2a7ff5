"""fathom bench sfc, PPTMon part: the interval for the median on/off ratio, the verdict it gives on
the 0.99 target, and the arithmetic of the programs' cost from the kernel's BPF statistics."""
import math
import random

import pytest

from fathom.bench import bpfstats
from fathom.bench import sfc as sb


def test_the_interval_is_the_sign_tests_order_statistics():
    # n = 10: P(Bin(10, 1/2) <= 1) = 11/1024, so (x_2, x_9) covers 1 - 22/1024; (x_3, x_8) covers less than 0.95
    xs = [0.90 + 0.01 * i for i in range(10)]
    random.Random(1).shuffle(xs)
    lo, hi, coverage = sb.median_ci(xs, 0.95)
    assert (lo, hi) == (pytest.approx(0.91), pytest.approx(0.98))
    assert coverage == pytest.approx(1 - 22 / 1024)
    # n = 6 is the fewest with a 0.95 interval: (min, max) at 1 - 2/64; n = 5 has none
    assert sb.median_ci([1, 2, 3, 4, 5, 6], 0.95) == (1, 6, pytest.approx(1 - 2 / 64))
    assert sb.median_ci([1, 2, 3, 4, 5], 0.95) is None
    assert sb.median_ci([], 0.95) is None


def test_the_interval_covers_the_median_as_often_as_it_says():
    rnd, n, trials, missed = random.Random(7), 10, 4000, 0
    for _ in range(trials):
        lo, hi, coverage = sb.median_ci([rnd.gauss(1.0, 0.05) for _ in range(n)], 0.95)
        missed += not lo <= 1.0 <= hi
    # coverage 0.979: about 86 misses in 4000; far more would mean the interval is too narrow
    assert missed / trials < 1 - coverage + 0.01


def test_the_verdict_needs_the_whole_interval_on_one_side():
    assert sb.verdict((0.991, 1.02, 0.98), 0.99) == "shown"
    assert sb.verdict((0.99, 1.0, 0.98), 0.99) == "shown"
    assert sb.verdict((0.95, 0.989, 0.98), 0.99) == "refuted"
    assert sb.verdict((0.97, 1.03, 0.98), 0.99) == "not resolved"
    assert sb.verdict(None, 0.99) == "not resolved (too few pairs)"


def test_a_programs_cost_is_its_run_time_over_the_runs_time():
    before, after = bpfstats.Count(1_000, 50_000), bpfstats.Count(501_000, 40_050_000)
    c = bpfstats.cost(before, after, 5.0)
    assert c["packets"] == 500_000 and c["packets_per_s"] == 100_000
    assert c["ns_per_packet"] == 80.0
    # 80 ns x 100 000 packets/s = 8 ms of every second: 0.8 % of one core
    assert c["core_share"] == pytest.approx(0.008)
    assert math.isclose(c["core_share"], c["ns_per_packet"] * c["packets_per_s"] / 1e9)
    idle = bpfstats.cost(after, after, 5.0)
    assert idle["packets"] == 0 and idle["ns_per_packet"] is None and idle["core_share"] == 0


def test_program_roles_follow_the_loaders_mode():
    assert sb.program_role("source-sink", "ppt_in") == "source"
    assert sb.program_role("source-sink", "ppt_out") == "stamp out + sink"
    assert sb.program_role("source", "ppt_out") == "stamp out"
    assert sb.program_role("transit", "ppt_in") == "stamp in"
    assert sb.program_role("sink", "ppt_out") == "stamp out + sink"


def test_the_cost_summary_takes_medians_per_program_and_of_the_chains_total():
    def prog(vnf, name, ns, pps, share):
        return {"vnf": vnf, "program": name, "role": "r", "mode": "source-sink", "ns_per_packet": ns,
                "packets_per_s": pps, "packets": int(pps * 5), "core_share": share}
    runs = [{"programs": [prog("fw1", "ppt_in", ns, 1000, ns * 1e-6), prog("fw1", "ppt_out", 2 * ns, 1000, 2 * ns * 1e-6)],
             "core_share": 3 * ns * 1e-6} for ns in (50, 70, 60)]
    s = sb.cost_summary(runs)
    by = {p["program"]: p for p in s["programs"]}
    assert by["ppt_in"]["ns_per_packet"] == 60 and by["ppt_out"]["ns_per_packet"] == 120
    assert by["ppt_in"]["packets"] == 15_000
    assert s["core_share"] == pytest.approx(180e-6)
    assert sb.cost_summary([]) == {"programs": [], "core_share": None}
