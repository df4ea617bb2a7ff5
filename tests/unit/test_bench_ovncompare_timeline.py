"""`fathom bench ovn-compare --replicas`: each port's timeline from its master's log (the pass that
turned it active), by the replica the call went to."""
import time
import types

from fathom.bench import ovncompare


def line(at: float, n: int, ms: float, steps: str, trigger: str = "feed") -> str:
    """A pass as fathom.controller.reconciler logs it, ending at `at` (epoch seconds)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f",{int(at * 1000) % 1000:03d}"
    return (f"{stamp} INFO fathom.reconciler: pass {n} ({trigger}): {ms:.1f} ms, 2 switches changed; "
            f"{steps}\n")


def test_each_port_gets_its_master_s_pass_that_turned_it_active(tmp_path):
    t0 = float(int(time.time())) + 0.25
    # replica 1 masters the port's switch: its pass with a `revalidate` step (a status turned active)
    (tmp_path / "controller-1.log").write_text(
        line(t0 - 1.0, 1, 5.0, "wait 0.1, read 2.0, make 1.0, revalidate 1.0, statuses 1.0")   # before the call
        + line(t0 + 0.030, 2, 10.0, "wait 0.1, read 4.0, compile 1.0, make 3.0")                # no status turned
        + "2026-01-01 00:00:00,000 INFO fathom.cluster: not a pass\n"
        + line(t0 + 0.080, 3, 50.0, "wait 0.1, read 12.0, compile 1.0, make 6.0, revalidate 21.0, statuses 5.0"))
    (tmp_path / "controller.log").write_text(line(t0 + 0.040, 7, 20.0, "read 3.0, revalidate 2.0", "api"))
    lab = types.SimpleNamespace(dir=tmp_path)
    runs = [{"t_api": t0, "t_api_done": t0 + 0.020, "t_up": t0 + 0.090, "replica": 0, "master": 1},
            {"t_api": t0, "t_api_done": t0 + 0.020, "t_up": None, "replica": 1, "master": 1}]
    got = ovncompare.timeline(types.SimpleNamespace(lab=lab, replicas=3), runs)
    assert runs[1]["timeline"] is None                  # never active: no figures
    t = runs[0]["timeline"]
    assert round(t["api_answered_ms"]) == 20 and round(t["pass_start_ms"]) == 30 and t["pass_ms"] == 50.0
    assert (t["read_ms"], t["compile_ms"], t["make_ms"], t["revalidate_ms"], t["statuses_ms"]) == (12, 1, 6, 21, 5)
    assert round(t["active_after_pass_ms"]) == 10
    assert got["all"]["n"] == 1 and got["call_to_other"]["n"] == 1 and got["call_to_master"] == {"n": 0}
    # one controller: its only log
    one = [{"t_api": t0, "t_api_done": t0 + 0.01, "t_up": t0 + 0.05}]
    assert ovncompare.timeline(types.SimpleNamespace(lab=lab, replicas=1), one)["all"]["pass_ms"] == 20.0
