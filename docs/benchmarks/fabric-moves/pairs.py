"""Every routed pair after each router move, many moves on one lab (the routing-matrix topology of
tests/lab/test_routing_matrix.py, lab prefix fpr): the router moves network-node <-> distributed
REPS times; after each move's status is `active`, every VM pings every VM of another network at
once (2 echoes, 200 ms apart, 1 s to answer), then, 1.5 s later, the ToR's drop counter is read.

    PYTHONPATH=. .venv/bin/python docs/benchmarks/fabric-moves/pairs.py REPS OUT.jsonl LABEL

One JSON line per move: the label (which code ran), the repetition, the mode, seconds from the
PATCH to `active`, the pairs that did not get both echoes back (with ping's output), and the
frames the ToR dropped since the previous move.
"""
import json
import sys
import time

from tests.lab import test_routing_matrix as matrix
from tests.lab.util import running_lab


def main(reps: int, out_path: str, label: str) -> None:
    pairs = [(a, b) for a in matrix.VMS for b in matrix.VMS
             if a != b and matrix.VMS[a][1] != matrix.VMS[b][1]]
    with running_lab("fpr", matrix._topology(), standalone=False) as lab, open(out_path, "a") as out:
        seen = matrix.tor_drops(lab)
        for rep in range(reps):
            for mode in ("network-node", "distributed"):
                t0 = time.time()
                matrix.set_mode(lab, mode)
                active = time.time() - t0
                answers = matrix.ping_all(lab, pairs)
                failed = {f"{s}->{d}": o for (s, d), o in sorted(answers.items()) if matrix.echoes(o)[0] != 2}
                time.sleep(1.5)
                now = matrix.tor_drops(lab)
                row = {"label": label, "rep": rep, "mode": mode, "patch_to_active_s": round(active, 3),
                       "pairs": len(pairs), "failed": failed, "tor_drops": now - seen}
                seen = now
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(rep, mode, f"{active:.3f} s", f"{len(failed)} of {len(pairs)} pairs failed",
                      f"ToR drops {row['tor_drops']}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
