"""RFC 2544 throughput (section 26.1): the highest offered rate at which the device loses no more than
the tolerated share of frames, found by binary search, then confirmed by full-length trials.

RFC 2544 section 24: a trial SHOULD last at least 60 s; a binary search MAY use shorter trials, "but
the final determination SHOULD be made with full length trials". So the search runs `trial_s` trials
and the rate it finds is then confirmed by `final_trials` trials of `final_s` each; a failed
confirmation steps the rate down and tries again. Pure logic: the caller passes the function that runs
one trial, so the search is tested without traffic (tests/unit/test_rfc2544.py).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

RFC_TRIAL_S = 60.0     # RFC 2544 section 24
GEN_LIMIT = 0.97       # achieved/offered below this: the generator, not the device, set the pace


@dataclass
class Trial:
    """What one trial at one offered rate gave."""
    offered_pps: float
    achieved_pps: float
    loss_ratio: float
    seconds: float
    passed: bool = False
    final: bool = False

    def row(self) -> dict:
        return {"offered_pps": round(self.offered_pps, 1), "achieved_pps": round(self.achieved_pps, 1),
                "loss_ratio": self.loss_ratio, "seconds": self.seconds, "pass": self.passed, "final": self.final}


@dataclass
class SearchPlan:
    trial_s: float = 2.0           # each search trial
    final_s: float = RFC_TRIAL_S   # each confirming trial (0: no confirmation)
    final_trials: int = 1          # confirming trials that must all pass
    final_attempts: int = 3        # rate step-downs after a failed confirmation
    resolution: float = 0.02       # stop when the bracket is narrower than this share of its top
    max_trials: int = 12           # search trials at most
    loss_tolerance: float = 0.0    # loss ratio accepted (RFC 2544: 0)

    @property
    def rfc_trial_length(self) -> bool:
        """True when the determination is made with trials of RFC 2544's full length."""
        return self.final_s >= RFC_TRIAL_S

    def describe(self) -> str:
        conf = (f", confirmed by {self.final_trials} trial(s) of {self.final_s:g} s" if self.final_s > 0
                else ", not confirmed by longer trials")
        label = "RFC 2544 trial length" if self.rfc_trial_length else "QUICK: shorter than RFC 2544's 60 s trials"
        return (f"binary search with {self.trial_s:g} s trials, {100 * self.resolution:g} % resolution, at most "
                f"{self.max_trials} trials{conf}; loss tolerance {self.loss_tolerance:g} ({label})")


@dataclass
class Result:
    throughput_pps: float            # the confirmed rate (the search's if there is no confirmation)
    search_pps: float                # what the short-trial search found
    confirmed: bool | None           # None: no confirming trial asked for
    generator_limited: bool          # the device passed at the tool's top rate: the tool is the limit
    trials: list[Trial] = field(default_factory=list)

    def row(self) -> dict:
        finals = [t.offered_pps for t in self.trials if t.final]
        return {"throughput_pps": round(self.throughput_pps, 1), "search_pps": round(self.search_pps, 1),
                "confirmed": self.confirmed, "lowest_confirming_rate_tried_pps": round(min(finals), 1) if finals else None,
                "generator_limited": self.generator_limited,
                "trials": len(self.trials), "search": [t.row() for t in self.trials]}


RunTrial = Callable[[float, float], tuple[float, float]]  # (offered_pps, seconds) -> (achieved_pps, loss_ratio)


def search(run_trial: RunTrial, top_pps: float, plan: SearchPlan) -> Result:
    """Binary search between 0 and top_pps (the tool's own ceiling), then the confirming trials.

    The first trial runs at the top: a device that passes there is as fast as the tool and is flagged
    generator-limited. A rate that fails sets the top of the bracket; after the first trial the top is
    never above what the generator achieved, since it cannot offer more."""
    if top_pps <= 0:
        raise ValueError("top_pps must be > 0")
    trials: list[Trial] = []

    def trial(rate: float, seconds: float, final: bool = False) -> Trial:
        achieved, loss = run_trial(rate, seconds)
        t = Trial(rate, achieved, loss, seconds, passed=(loss or 0.0) <= plan.loss_tolerance, final=final)
        trials.append(t)
        return t

    first = trial(top_pps, plan.trial_s)
    if first.passed:
        lo, best, hi = top_pps, first.achieved_pps, top_pps
    else:
        lo, best, hi = 0.0, 0.0, min(top_pps, first.achieved_pps)
        while hi - lo > plan.resolution * hi and len(trials) < plan.max_trials:
            rate = (lo + hi) / 2
            t = trial(rate, plan.trial_s)
            if t.passed:
                lo, best = rate, t.achieved_pps
            else:
                hi = rate
    generator_limited = first.passed
    search_pps = best
    if plan.final_s <= 0 or best <= 0:
        return Result(best, search_pps, None, generator_limited, trials)

    # confirmation with full-length trials; each failure steps down by the larger of the resolution
    # and the bracket the search ended with
    step = max(plan.resolution, (hi - lo) / hi if hi > 0 else plan.resolution, 0.05)
    rate = lo
    for _ in range(1 + plan.final_attempts):
        runs = [trial(rate, plan.final_s, final=True) for _ in range(plan.final_trials)]
        if all(t.passed for t in runs):
            return Result(min(t.achieved_pps for t in runs), search_pps, True, generator_limited, trials)
        rate *= 1 - step
    return Result(0.0, search_pps, False, generator_limited, trials)


def summarize_repeats(values: list[float]) -> dict:
    """Several independent determinations of one throughput (pps): their median, min and max."""
    if not values:
        return {"repeats": 0, "median_pps": None, "min_pps": None, "max_pps": None, "values_pps": []}
    return {"repeats": len(values), "median_pps": round(statistics.median(values), 1),
            "min_pps": round(min(values), 1), "max_pps": round(max(values), 1),
            "values_pps": [round(v, 1) for v in values]}
