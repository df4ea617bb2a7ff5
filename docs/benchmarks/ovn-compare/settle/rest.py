"""The fathom controller's CPU second by second after the bench's traffic check, in 10 ms ticks:
where an at-rest window that opened at once would start. Brings up the fathom half of `fathom bench
ovn-compare`'s lab (labs named rsf), runs the traffic check, prints 40 one-second readings and
removes the lab. Run as root from a worktree:

    .venv/bin/python docs/benchmarks/ovn-compare/settle/rest.py
"""
import json
import time

from fathom.bench.ovncompare import Bench

bench = Bench(prefix="rs", repeats=1, ports=1, seconds=2, batch=50, window_s=20, rest_s=0, progress=lambda m: None)
fathom = bench.systems[0]
bench.systems, bench.seq = [fathom], {fathom.name: 0}
try:
    fathom.up(lambda m: None)
    bench.check_traffic(fathom)
    pid = fathom.lab.state()["controller"]["pid"]

    def ticks() -> int:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    last, series = ticks(), []
    for _ in range(40):
        time.sleep(1)
        now = ticks()
        series.append(now - last)
        last = now
    print(json.dumps({"controller_ticks_per_second_after_traffic_check": series}))
finally:
    fathom.down()
