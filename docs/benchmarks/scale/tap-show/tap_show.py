"""CPU and SQL statements of one tap policy's answer (`GET /v1/taps/<id>`) and of a page of ten
(`GET /v1/taps?limit=10`) as the store holds more policies: the API app over a real store, called
in-process (no HTTP), this process's CPU, with the garbage collector's thresholds the controller
sets (fathom.controller.server). Each policy names three ports of its own.

usage: tap_show.py DB_URL [SIZES...]      (default sizes: 10 300); one JSON line per size and call
"""
import json
import statistics
import sys
import time

from fathom.bench.inprocess import admin_client


def main(url: str, sizes: list[int]) -> None:
    http, statements = admin_client(url)

    def call(method, path, body=None):
        r = http.request(method, path, json=body)
        assert r.status_code in (200, 201), r.text
        return r.json()
    call("POST", "/v1/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
    net = call("POST", "/v1/networks", {"name": "taps"})
    call("POST", "/v1/subnets", {"network_id": net["id"], "cidr": "198.18.0.0/16"})
    policies: list[int] = []
    for size in sizes:
        while len(policies) < size:
            i = len(policies)
            ends = [call("POST", "/v1/ports", {"network_id": net["id"], "node": "c1", "interface_name": f"t{i}{r}"})["id"]
                    for r in "srm"]
            policies.append(call("POST", "/v1/taps", {"sender": ends[0], "receiver": ends[1], "monitor": ends[2]})["id"])
        for what, path in (("GET /v1/taps/<id>", f"/v1/taps/{policies[0]}"), ("GET /v1/taps?limit=10", "/v1/taps?limit=10")):
            cpu, counts = [], []
            for _ in range(7):
                statements.clear()
                start = time.process_time()
                call("GET", path)
                cpu.append(1000 * (time.process_time() - start))
                counts.append(len(statements))
            print(json.dumps({"policies": size, "call": what, "statements": statistics.median(counts),
                              "cpu_ms_median": round(statistics.median(cpu), 2), "cpu_ms": [round(c, 2) for c in cpu]}),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [int(a) for a in sys.argv[2:]] or [10, 300])
