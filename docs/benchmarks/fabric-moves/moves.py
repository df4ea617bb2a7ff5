"""Echoes lost across router mode moves, many moves on one lab (the l3 bench topology, lab prefix
fmv): a ping every 10 ms from va to vd across each PATCH of r1's mode, in the order
fabric, network-node, distributed, network-node, fabric, distributed, REPS times.

    PYTHONPATH=. .venv/bin/python docs/benchmarks/fabric-moves/moves.py REPS OUT.jsonl [SETTLE ...]

One JSON line per move: the mode, echoes sent, the icmp_seq of every echo lost and when (the
reply before it, seconds after the PATCH). With SETTLE values, repetition i writes SETTLE[i % n]
to /tmp/fathom-settle before its moves, for a controller patched to read its settle time from
there (moves-settle-knob.patch beside this script): the settings interleaved on one lab.
"""
import json
import sys
import time
from pathlib import Path

import fathom.bench
from tests.lab.util import BackgroundPing, await_status, lab_api, running_lab

TOPOLOGY = (Path(fathom.bench.__file__).parent / "topologies" / "l3.yaml").read_text()
MODES = ("fabric", "network-node", "distributed", "network-node", "fabric", "distributed")
INTERVAL = 0.01


def main(reps: int, out_path: str, settles: list[str]) -> None:
    with running_lab("fmv", TOPOLOGY, standalone=False) as lab, open(out_path, "a") as out:
        c = lab_api(lab)
        rid = next(r["id"] for r in c.get("/routers").json() if r["name"] == "r1")
        for rep in range(reps):
            settle = settles[rep % len(settles)] if settles else None
            if settle is not None:
                Path("/tmp/fathom-settle").write_text(settle)
            for mode in MODES:
                ping = BackgroundPing(lab, "va", "198.19.20.12", 30, interval=INTERVAL)
                time.sleep(0.5)
                t0 = time.time()
                c.patch(f"/routers/{rid}", json={"mode": mode}).raise_for_status()
                await_status(c, f"/routers/{rid}")
                answered = time.time() - t0
                time.sleep(1)
                sent, replies = ping.stop()
                lost = sorted(set(range(1, sent)) - {q for q, _ in replies})   # the last may be in flight
                rec = {"rep": rep, "settle": settle, "mode": mode, "sent": sent, "lost": lost,
                       "lost_after_patch_s": [round(max((t for q2, t in replies if q2 < q), default=t0) - t0, 3)
                                              for q in lost],
                       "patch_to_status_s": round(answered, 3)}
                print(json.dumps(rec), flush=True)
                out.write(json.dumps(rec) + "\n")
                out.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
