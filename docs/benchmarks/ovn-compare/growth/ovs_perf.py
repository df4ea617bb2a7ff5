"""Where the nodes' ovs-vswitchd spend their CPU while fathom's tenant grows: the fathom half of
`fathom bench ovn-compare`'s lab (labs named gpf), two batches of 50 ports as the bench makes
them (4 -> 104 ports), then `perf record -g` on every ovs-vswitchd of the lab during a third
batch of 30. Run as root from the repository:

    .venv/bin/python docs/benchmarks/ovn-compare/growth/ovs_perf.py /tmp/ovs.perf
    perf report -i /tmp/ovs.perf --no-children --sort comm,dso --stdio -g none
"""
import json
import subprocess
import sys
import time

from fathom.bench.ovncompare import Bench

bench = Bench(prefix="gp", repeats=1, ports=1, seconds=2, batch=50, window_s=0, rest_s=0)
fathom = bench.systems[0]
bench.systems, bench.seq = [fathom], {fathom.name: 0}
try:
    fathom.up(lambda msg: print(msg, file=sys.stderr))
    bench.grow(fathom, 50)
    bench.grow(fathom, 50)
    pids = subprocess.run(["pgrep", "-f", f"ovs-vswitchd.*/{fathom.lab.name}/"], capture_output=True,
                          text=True).stdout.split()
    perf = subprocess.Popen(["perf", "record", "-g", "-o", sys.argv[1], "-p", ",".join(pids)],
                            stderr=subprocess.DEVNULL)
    time.sleep(1)
    grown = bench.grow(fathom, 30)
    perf.send_signal(2)
    perf.wait()
    print(json.dumps({"third batch": grown}, indent=1, default=str))
finally:
    fathom.down()
