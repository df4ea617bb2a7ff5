"""ratio_ci.py RUN_DIR...: for each `fathom bench ovn-compare --replicas N` run, the → `active` p50 and p99
ratio (the cluster over one controller) and a 95 % bootstrap interval of each (2,000 resamples of
both sides' ports, seeded: the same figures every time), as JSON on stdout."""
import json
import random
import statistics
import sys


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ports(results, system):
    return [r["up_ms"] for r in results["port_up"][system]["plug_first"]["runs"] if r.get("up_ms") is not None]


def main():
    out = {}
    for run in sys.argv[1:]:
        results = json.load(open(f"{run}/results.json"))
        one, cluster = ports(results, "fathom-1"), ports(results, "fathom-3")
        rng = random.Random(1)
        p50s, p99s = [], []
        for _ in range(2000):
            a, b = rng.choices(one, k=len(one)), rng.choices(cluster, k=len(cluster))
            p50s.append(statistics.median(b) / statistics.median(a))
            p99s.append(quantile(b, 0.99) / quantile(a, 0.99))
        p50s.sort(), p99s.sort()
        out[run] = {"ports": [len(one), len(cluster)],
                    "p50_ms": [round(statistics.median(one), 1), round(statistics.median(cluster), 1)],
                    "p50_ratio": round(statistics.median(cluster) / statistics.median(one), 3),
                    "p50_ratio_95": [round(p50s[50], 3), round(p50s[1949], 3)],
                    "p99_ratio": round(quantile(cluster, 0.99) / quantile(one, 0.99), 2),
                    "p99_ratio_95": [round(p99s[50], 2), round(p99s[1949], 2)]}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
