"""Inclusive and own shares of the functions in py-spy's raw (folded) samples, counting only the
stacks that contain a given frame (e.g. the reconciler's thread). Usage:

    python3 fold.py <samples.raw or .raw.gz> 'Reconciler.run_forever' [how many rows]

`py-spy-ports.raw.gz` beside this: `py-spy record --gil -r 100 -f raw -d 20 --nonblocking` on the
controller of a 100 x 100 scale bench run of 6ba2fba (02:21 UTC) from the start of its timing of 20
new ports (docs/benchmarks/scale/freeze/py-spy.sh with py-spy from the venv and -d 20); the window
also holds the bench's full resync after the ports, which the reconciler's thread does not run.
"""
import collections
import gzip
import re
import sys

path, must = sys.argv[1], sys.argv[2]
rows = int(sys.argv[3]) if len(sys.argv) > 3 else 40
inclusive, own = collections.Counter(), collections.Counter()
total = 0
with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
    for line in f:
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack or must not in stack:
            continue
        frames = [re.sub(r":\d+\)$", ")", fr) for fr in stack.split(";")]
        total += int(n)
        for name in set(frames):
            inclusive[name] += int(n)
        own[frames[-1]] += int(n)
print("samples", total)
for name, n in inclusive.most_common(rows):
    print(f"{n:6d} {100 * n / total:5.1f}%  {name[:150]}")
print("--- own")
for name, n in own.most_common(rows // 2):
    print(f"{n:6d} {100 * n / total:5.1f}%  {name[:150]}")
