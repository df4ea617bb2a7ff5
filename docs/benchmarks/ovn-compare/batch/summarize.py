"""Summary of the before/after runs of profile.py (docs/benchmarks/ovn-compare/cpdiff/profile/):
controller CPU per batch of 50 ports (to all up, over the 20 s window), passes, time to all up;
and, from py-spy's folded stacks (`*-0.txt`, `*-1.txt`), where the GIL-holding samples went.

    python3 docs/benchmarks/ovn-compare/batch/summarize.py > docs/benchmarks/ovn-compare/batch/summary.md
"""
import collections
import json
from pathlib import Path

HERE = Path(__file__).parent
RATE = 200   # py-spy's samples per second (profile.py --rate 200)
# (share, frame that marks it): a sample counts for the first share whose frame is in its stack
SHARES = [
    ("port numbers from the OVSDB replica", "NodeOvsdb.ofports"),
    ("agents' statuses (reports read, host-local state)", "HostLocalStatus.after_pass"),
    ("status decide and write", "Reconciler._write_statuses"),
    ("store read", "Reconciler._read_store"),
    ("compile (apps, derive)", "Reconciler._compile"),
    ("apply: diff, encode, send", "Reconciler._apply"),
    ("rest of the pass", "Reconciler.run_pass"),
    ("OVSDB IDL thread", "Idl.run"),
    ("os-ken (OpenFlow I/O, LLDP)", "HubThread.run"),
    ("API handlers (thread pool)", "WorkerThread.run"),
    ("API event loop", "BaseEventLoop.run_forever"),
]


def shares(path: Path) -> tuple[int, dict[str, int]]:
    total, out = 0, collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        total += int(n)
        out[next((name for name, frame in SHARES if frame in stack), "other")] += int(n)
    return total, out


def main() -> None:
    print("# Controller CPU per batch of 50 ports, before and after\n")
    print("| run | batch | CPU to all up (s) | CPU over 20 s (s) | passes | all up after (s) |")
    print("|---|---|---|---|---|---|")
    for side in ("before", "after"):
        for f in sorted((HERE / side).glob("*.json")):
            for batch, v in json.loads(f.read_text()).items():
                g, a, b = v["grow"], v["health_after"], v["health_before"]
                print(f"| {side}/{f.stem} | {batch} | {g['cpu_s_to_all_up']['control_plane']['total']:.2f} | "
                      f"{g['cpu_s_window']['control_plane']['total']:.2f} | {a['passes'] - b['passes']} | "
                      f"{g['all_up_s']:.1f} |")
    print("\n# Where the samples went (py-spy --gil, 200 Hz, both batches): seconds holding the GIL (share)\n")
    cols = {}
    for side in ("before", "after"):
        total, c = 0, collections.Counter()
        for f in sorted((HERE / side).glob("profile-*.txt")):
            t, s = shares(f)
            total += t
            c.update(s)
        if total:
            cols[side] = (total, c)
    print("| share | " + " | ".join(f"{s} ({t / RATE:.2f} s)" for s, (t, _) in cols.items()) + " |")
    print("|---|" + "---|" * len(cols))
    for name in [n for n, _ in SHARES] + ["other"]:
        print(f"| {name} | " + " | ".join(f"{c[name] / RATE:.2f} s ({100 * c[name] / t:.0f} %)"
                                           for t, c in cols.values()) + " |")


if __name__ == "__main__":
    main()
