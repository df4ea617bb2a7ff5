"""Where PPTMon's time of a VNF on a port chain differs from a capture at the same host interfaces.

One hybrid-plugged firewall (fw1, nft, 20 rules) on a measured port chain of one group (source-sink,
every packet sampled), a paced stream of 200-byte UDP datagrams from the client through it. Per
packet (matched by IP id):

- PPTMon: the sink's egress stamp (the record's `time_ns`, CLOCK_MONOTONIC at `ppt_out` on the TC
  ingress of `tapfw1o`, converted by the loader) and the VNF's time (`ppt_us`);
- the capture (tcpdump, nanosecond kernel stamps) on `tapfw1i` (out, towards the VM) and `tapfw1o`
  (in, from the VM), and inside the VM on eth0 (in) and eth1 (out).

So the difference PPTMon − capture splits into the part before the packet leaves for the VM (ingress
side: PPTMon's ingress stamp to the capture's at tapfw1i) and the part after it came back (egress
side: the capture's stamp at tapfw1o to PPTMon's egress stamp).

    sudo .venv/bin/fathom bench sfc-accuracy -o OUTPUT_DIR
"""
from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

from fathom.client import Client
from fathom.host.exec import argv
from fathom.lab.capture import Capture, fields
from fathom.lab.lab import Lab
from fathom.lab.topology import parse

LAB = "znacc"
TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1251, cidr: 198.19.41.0/24}
nodes:
  - name: compute1
    vms:
      - {name: client, mac: "02:fa:00:00:29:0b", ip: 198.19.41.11/24, network: blue}
    vnfs:
      - {name: fw1, kind: firewall, rules: 20, network: blue, plug: hybrid,
         ingress: {mac: "02:fb:00:00:29:65", ip: 198.19.41.101/24}, egress: {mac: "02:fb:00:00:29:66", ip: 198.19.41.102/24}}
  - name: compute2
    vms:
      - {name: server, mac: "02:fa:00:00:29:15", ip: 198.19.41.21/24, network: blue}
underlay: {cidr: 198.18.41.0/24, mtu: 1600}
"""
PORT = 9999
SENDER = """
import socket, sys, time
n, rate = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
t = time.monotonic()
for i in range(n):
    s.sendto(b"x" * 172, ("198.19.41.21", %d))
    t += 1 / rate
    time.sleep(max(0.0, t - time.monotonic()))
""" % PORT
# (namespace, device, direction): where the capture runs
POINTS = {"host_in": ("compute1", "tapfw1i", "out"), "guest_in": ("fw1", "eth0", "in"),
          "guest_out": ("fw1", "eth1", "out"), "host_out": ("compute1", "tapfw1o", "in")}


def _stamps(pcap: Path) -> dict[int, int]:
    """IP id -> the capture's stamp (ns since the epoch) of each datagram to PORT."""
    got = {}
    for t, ipid in fields(pcap, "frame.time_epoch", "ip.id", display=f"udp.dstport == {PORT}"):
        sec, _, frac = t.partition(".")
        got[int(ipid, 16) if ipid.startswith("0x") else int(ipid)] = int(sec) * 10**9 + int(frac.ljust(9, "0")[:9])
    return got


def _summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    return {"count": len(xs), "min": xs[0], "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": xs[-1],
            "mean": round(statistics.fmean(xs), 3)}


def measure(packets: int, rate: float, workdir: Path) -> dict:
    lab = Lab(LAB)
    lab.down()
    lab.up(parse(TOPOLOGY, f"<{LAB}>"), f"<{LAB}>", standalone=False)
    try:
        api = Client.for_lab(lab.state())
        ids = lab.state()["controller"]["created"]
        g = api.post("/sfc/port_pair_groups", json={"name": "fw", "port_pairs": [ids["port_pairs"]["fw1"]],
                                                     "project_id": "demo"})
        fc = api.post("/sfc/flow_classifiers", json={
            "protocol": "udp", "destination_port_range_min": PORT, "destination_port_range_max": PORT,
            "logical_source_port": ids["ports"]["client"], "logical_destination_port": ids["ports"]["server"],
            "project_id": "demo"})
        ch = api.post("/sfc/port_chains", json={"name": "acc", "port_pair_groups": [g["id"]],
                                                "flow_classifiers": [fc["id"]], "project_id": "demo",
                                                "pptmon": {"period_ns": 0}})
        assert api.wait_status("sfc/port_chains", ch["id"], timeout=90)["status"] == "active"
        with contextlib.ExitStack() as stack:
            caps = {name: stack.enter_context(Capture(lab.ns(where), dev, workdir / f"{name}.pcap", f"udp port {PORT}",
                                                      immediate=False, nano=True, direction=direction))
                    for name, (where, dev, direction) in POINTS.items()}
            since = time.time_ns()
            subprocess.run(argv(["python3", "-c", SENDER, str(packets), str(rate)], lab.ns("client")),
                           check=True, timeout=packets / rate + 60)
            time.sleep(3)        # the sink's last records delivered
        records = api.get("/pptmon/records", params={"chain": f"port_chain:{ch['id']}", "limit": 5000,
                                                     "since": str(since)})
        stamps = {name: _stamps(cap.path) for name, cap in caps.items()}
    finally:
        lab.down()
    rows = []
    for r in records:
        ipid, hop = r["flow"]["ip_id"], r["hops"][0]
        if hop["ppt_us"] is None or not all(ipid in s for s in stamps.values()):
            continue
        out_ns = r["time_ns"]
        in_ns = out_ns - hop["ppt_us"] * 1000          # PPTMon's stamps are µs apart (24-bit µs field)
        s = {k: v[ipid] for k, v in stamps.items()}
        rows.append({"pptmon_us": hop["ppt_us"], "capture_us": (s["host_out"] - s["host_in"]) / 1000,
                     "in_side_us": (s["host_in"] - in_ns) / 1000, "out_side_us": (out_ns - s["host_out"]) / 1000,
                     "host_to_guest_us": (s["guest_in"] - s["host_in"]) / 1000,
                     "guest_us": (s["guest_out"] - s["guest_in"]) / 1000,
                     "guest_to_host_us": (s["host_out"] - s["guest_out"]) / 1000})
    fields = list(rows[0]) if rows else []
    return {"packets_sent": packets, "rate_per_s": rate, "records": len(records), "matched": len(rows),
            "difference_us": _summary([r["pptmon_us"] - r["capture_us"] for r in rows]) if rows else None,
            **{k: _summary([r[k] for r in rows]) for k in fields},
            "env": {"kernel": platform.release(), "cpus": os.cpu_count(), "load_1m": os.getloadavg()[0]}}
