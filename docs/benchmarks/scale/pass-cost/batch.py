"""Two batches of 50 ports on the fathom half of `fathom bench ovn-compare`'s lab (labs named
pbf), as the bench grows its tenant (API call, then the VIF at once; 4 -> 54 -> 104 ports): one
JSON line per batch (time to all up, control-plane and nodes' OVS CPU to all up). The pass count
line after them was counted from the lab's controller.log (`grep -c "pass .*("`). Run as root
from the repository (with PYTHONPATH=<worktree> for another tree's code):

    .venv/bin/python docs/benchmarks/scale/pass-cost/batch.py > batch-<tree>-<run>.jsonl
"""
import json
import sys

from fathom.bench.ovncompare import Bench

bench = Bench(prefix="pb", repeats=1, ports=1, seconds=2, batch=50, window_s=0, rest_s=0)
fathom = bench.systems[0]
bench.systems, bench.seq = [fathom], {fathom.name: 0}
try:
    fathom.up(lambda msg: print(msg, file=sys.stderr))
    for _ in range(2):
        r = bench.grow(fathom, 50)
        print(json.dumps({"api_and_plug_s": r["api_and_plug_s"], "all_up_s": r["all_up_s"],
                          "cpu": r["cpu_s_to_all_up"]["control_plane"], "ovs": r["cpu_s_to_all_up"]["node_ovs"]["total"]}))
finally:
    fathom.down()
