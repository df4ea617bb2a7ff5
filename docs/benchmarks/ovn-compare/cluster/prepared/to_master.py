"""Measurement only (docs/benchmarks/ovn-compare/cluster/prepared, ports-200/to-master*): `fathom bench
ovn-compare --replicas 3 --stop-others` with its stop left out, so every call goes to the master of c1's
br-int while the other replicas run on; with `--prefix tn`, their threads at nice 19 (set every 0.5 s,
so threads started later too). Run as the fathom CLI: `python to_master.py bench ovn-compare ...`. The
runs' summary.md keeps the bench's own sentence that the other replicas were stopped: here they were not."""
import os
import sys
import threading
import time

from fathom.bench import ovncompare


def keep_only(self, master):
    self.callees, self.api = [master], self.apis[master]
    return []


def alone(self, s):
    master = s.note((0, None, "c1"))["master"]
    s.keep_only(master)
    if "tn" in sys.argv:
        pids = [r["pid"] for i, r in enumerate(s.lab.state()["controller"]["replicas"]) if i != master]
        print(f"niced replicas other than {master}: {pids}", file=sys.stderr, flush=True)

        def renice():
            while True:
                for pid in pids:
                    for tid in os.listdir(f"/proc/{pid}/task") if os.path.exists(f"/proc/{pid}/task") else ():
                        try:
                            os.setpriority(os.PRIO_PROCESS, int(tid), 19)
                        except OSError:
                            pass
                time.sleep(0.5)
        threading.Thread(target=renice, daemon=True).start()
    return []


ovncompare.FathomSystem.keep_only = keep_only
ovncompare.ClusterBench.alone = alone
from fathom.cli.main import cli  # noqa: E402
cli()
