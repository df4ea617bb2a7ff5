"""CPU and SQL statements of one list call (ports, networks, security groups, and the tap policies:
one, naming three of the ports) as the store holds more objects: the API app over a real store, called in-process (no HTTP), this process's CPU, with the
garbage collector's thresholds the controller sets (fathom.controller.server).

usage: lists.py DB_URL [SIZES...]      (default sizes: 100 1000); one JSON line per size and list
"""
import json
import statistics
import sys
import time

from fathom.bench.inprocess import admin_client

PATHS = ("/v1/ports", "/v1/networks", "/v1/security-groups", "/v1/taps")


def main(url: str, sizes: list[int]) -> None:
    http, statements = admin_client(url)

    def post(path, body):
        r = http.post(path, json=body)
        assert r.status_code == 201, r.text
        return r.json()
    net = post("/v1/networks", {"name": "ports"})
    post("/v1/subnets", {"network_id": net["id"], "cidr": "198.18.0.0/16"})
    held, named = 0, []
    for size in sizes:
        for i in range(held, size):
            group = post("/v1/security-groups", {"name": f"g{i}"})
            post("/v1/security-group-rules", {"security_group_id": group["id"], "direction": "ingress"})
            other = post("/v1/networks", {"name": f"n{i}"})
            post("/v1/subnets", {"network_id": other["id"], "cidr": f"10.{i // 64}.{(i % 64) * 4}.0/22"})
            port = post("/v1/ports", {"network_id": net["id"], "security_groups": [group["id"]]})
            if i < 3:
                named.append(port["id"])
            if i == 2:
                post("/v1/taps", {"sender": named[0], "receiver": named[1], "monitor": named[2]})
        held = size
        for path in PATHS:
            cpu = []
            for _ in range(5):
                statements.clear()
                start = time.process_time()
                r = http.get(path, params={"limit": 1000})
                cpu.append(1000 * (time.process_time() - start))
                assert r.status_code == 200, r.text
            print(json.dumps({"objects": size, "list": path, "returned": len(r.json()), "statements": len(statements),
                              "cpu_ms_median": round(statistics.median(cpu), 2), "cpu_ms": [round(c, 2) for c in cpu]}),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [int(a) for a in sys.argv[2:]] or [100, 1000])
