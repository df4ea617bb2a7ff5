"""One API-rate run (PostgreSQL, 8 writers, one network) with the controller's CPU by thread name:
every Python thread of the controller is named at the OS level (a sitecustomize on PYTHONPATH sets
PR_SET_NAME from threading's name) and schedstat is summed per name; the reconciler's pass steps
(/v1/health pass_steps_total, wall time) and its passes over the run beside it.
Args: OUT PORTS [API_WORKERS]; SPY=1 (or "1 --gil") records py-spy samples in OUT/spy.txt (PYSPY: its
path); PGSTAT=1 writes pg_stat_statements' counts to OUT/pgstat.txt; PREFIX names the run's PostgreSQL and
run directory (default c6); run from the repository (PYTHONPATH=<tree> for another tree). Beside the
figures: the event loop thread's ticks and context switches, PostgreSQL's commits and rollbacks.
STEPCPU=1: /v1/health's pass_steps_total made of each step's thread CPU (`_Steps` patched: thread_time
for each step, `wall` the pass's wall time to its last step; `wait` stays wall time). PASSPROF=FILE
instead: a cProfile (wall clock; PASSCPU=1: thread CPU, which slows the passes several times) of
every pass, dumped every 20 passes. The pacing's trials of burst-passes/ read XBF, XMIN, XPER from
the environment in a tree with that hook (its README)."""
import json, os, sys, tempfile
from pathlib import Path

SITE = '''import ctypes, threading
_libc = ctypes.CDLL(None)
_orig = threading.Thread._bootstrap_inner
def _named(self):
    try:
        _libc.prctl(15, self.name.encode()[:15], 0, 0, 0)
    except Exception:
        pass
    return _orig(self)
threading.Thread._bootstrap_inner = _named

import os as _os, sys as _sys, time as _time, cProfile as _cp
def _patch():
    while 'fathom.controller.reconciler' not in _sys.modules or not hasattr(_sys.modules['fathom.controller.reconciler'], 'Reconciler'):
        _time.sleep(0.05)
    R = _sys.modules['fathom.controller.reconciler'].Reconciler
    if _os.environ.get('STEPCPU'):
        S = _sys.modules['fathom.controller.reconciler']._Steps
        def _init(self, started):
            self.times = {}; self._last = _time.thread_time(); self._t0 = _time.monotonic()
        def _done(self, step):
            now = _time.thread_time(); self.times[step] = self.times.get(step, 0.0) + now - self._last; self._last = now; self.times['wall'] = _time.monotonic() - self._t0
        S.__init__ = _init; S.done = _done
        return
    orig = R.run_pass
    prof = _cp.Profile(_time.thread_time) if _os.environ.get("PASSCPU") else _cp.Profile(); n = [0]
    out = _os.environ['PASSPROF']
    def run_pass(self, *a, **k):
        prof.enable()
        try:
            return orig(self, *a, **k)
        finally:
            prof.disable(); n[0] += 1
            if n[0] % 20 == 0:
                prof.dump_stats(out)
    R.run_pass = run_pass
if _os.environ.get('PASSPROF') or _os.environ.get('STEPCPU'):
    threading.Thread(target=_patch, daemon=True).start()
'''
PREFIX = os.environ.get("PREFIX", "c6")     # the lab prefix of its PostgreSQL, run directory and files
site = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-site-"))
(site / "sitecustomize.py").write_text(SITE)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(site)]))

from fathom.bench import procs                       # noqa: E402
from fathom.bench.postgres import PostgresServer     # noqa: E402
from fathom.bench.scale import api as api_bench      # noqa: E402
from fathom.bench.scale.common import Controller     # noqa: E402

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
ports = int(sys.argv[2]); workers = int(sys.argv[3]) if len(sys.argv) > 3 else 1
_part = api_bench._part


def label_of(controller: int, store: int):
    base = _part(controller, store)

    def label(group, pid, tid):
        part = base(group, pid, tid)
        if group == "controller":
            try:
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                comm = "?"
            part = f"{part}: {'event loop' if tid == pid else comm}"
        return part
    return label


def loop_stat(pid):
    """The event loop thread's user and system CPU (ms, from /proc ticks) and context switches."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    status = dict(l.split(":\t") for l in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines() if ":\t" in l)
    return {"user_ms": int(fields[11]) * tick, "system_ms": int(fields[12]) * tick,
            "voluntary_switches": int(status["voluntary_ctxt_switches"]),
            "involuntary_switches": int(status["nonvoluntary_ctxt_switches"])}


import fathom.bench.postgres as _pgmod   # noqa: E402
_pgmod.PREFIX = f"fathom-pg-{PREFIX}-"
pg = PostgresServer(durable=True).start()
if os.environ.get("PGSTAT"):   # statement counts (pg_stat_statements costs CPU: not for the figures)
    pg.halt(); pg._options += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"; pg.resume()
url = pg.new_database()
ctl = Controller(Path(f"/run/fathom-bench/{PREFIX}-prof-{os.getpid()}"), url, api_workers=workers).start()
try:
    api_bench._part = label_of   # the run's parts by thread name
    spy = None
    if os.environ.get("SPY"):   # py-spy on the controller, on-CPU samples of every thread (SPY=--gil: the GIL's holder)
        import subprocess, time
        spy = subprocess.Popen([os.environ.get("PYSPY", str(Path(sys.executable).with_name("py-spy"))), "record", "--pid", str(ctl.proc.pid),
                                "-r", "200", "-f", "raw", "-o", str(out / "spy.txt"), "--nonblocking", "--threads",
                                *os.environ["SPY"].split()[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
    before = ctl.api.get("/health")
    loop0 = loop_stat(ctl.proc.pid)
    r = api_bench.api_rate(ctl, 8, ports, True, print, store_pid=pg.pid())
    after = ctl.api.get("/health")
    loop1 = loop_stat(ctl.proc.pid)
    r["event_loop_per_port"] = {k: round((loop1[k] - loop0[k]) / r["ports"], 4) for k in loop0}
    if spy is not None:
        spy.send_signal(2); spy.wait(60)
    steps = {k: round(1000 * (v - before["pass_steps_total"].get(k, 0.0)) / r["ports"], 4)
             for k, v in after["pass_steps_total"].items()}
    r["pass_steps_wall_ms_per_port"] = steps
    r["passes"] = after["passes"] - before["passes"]
    import psycopg   # the run's transactions: committed, rolled back (a failed statement: a retry)
    with psycopg.connect(host=str(pg.socket_dir), port=5432, user="postgres", dbname="postgres") as c:
        r["pg_xacts"] = dict(zip(("commit", "rollback"), c.execute(
            "SELECT sum(xact_commit), sum(xact_rollback) FROM pg_stat_database").fetchone()))
    (out / "r.json").write_text(json.dumps(r, indent=1, default=int))
    if os.environ.get("PGSTAT"):
        with psycopg.connect(host=str(pg.socket_dir), port=5432, user="postgres", dbname=url.split("@/")[1].split("?")[0], autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            rows = c.execute("SELECT calls, round(total_exec_time::numeric,1), round(total_plan_time::numeric,1), query FROM pg_stat_statements WHERE query !~* '^ *(CREATE|ALTER|COMMENT)' ORDER BY calls DESC").fetchall()
            with open(out / "pgstat.txt", "w") as f:
                for r_ in rows: f.write(f"{r_[0]:8d} {r_[1]:>10} {r_[2]:>8} {' '.join(r_[3].split())[:250]}\n")
    print(json.dumps({k: r[k] for k in ("ports_per_second", "control_plane_cpu_ms_per_port", "schedstat_ms_per_port",
                                        "passes", "event_loop_per_port", "per_call_ms", "n_errors")}, indent=1))
finally:
    ctl.stop(); pg.stop()
