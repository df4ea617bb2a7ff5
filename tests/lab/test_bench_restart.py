"""Lab test of `fathom bench restart` (lab zp2): one short round. It checks that the benchmark measures
what it says, not how fast: the controller really went away and came back, both ports turned active
after its API answered, every switch came back, no other port's status left active meanwhile (the
restart grace), and the lab is gone afterwards."""
from __future__ import annotations

import pytest

from fathom.bench.restart import Bench
from fathom.lab.lab import Lab

pytestmark = pytest.mark.lab


def test_one_restart_round():
    doc = Bench("zp2", rounds=1, downtime=2.0).run()
    (r,) = doc["rounds"]
    assert r["t_api"] - r["t_stopped"] >= 2.0                 # down for the downtime at least
    for key in ("switches_s", "plugged_meanwhile_active_s", "created_after_active_s"):
        assert r[key] is not None and r[key] >= 0, (key, r)   # measured from the API's first answer
    assert r["created_after_active_s"] >= r["created_after_call_s"]
    assert r["other_port_samples"] > 0 and r["other_ports_not_active"] == [], r
    assert doc["summary"]["never_active"] == 0
    assert not Lab("zp2").exists()
