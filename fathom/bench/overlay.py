"""Overlay module (the VXLAN paper, Fig. 8): throughput against frame size through a VXLAN tunnel between two
OVS nodes of a lab, against the same path on a VLAN (no tunnel), measured side by side in one run.

A lab `<prefix>ov` (`sbov` by default) is built from topologies/overlay.yaml (standalone: OVS NORMAL
switching, userspace tunnelling with its ARP-learned neighbour table) and removed afterwards, even on
failure. Throughput is RFC 2544's (rfc2544.py), with the run's search plan; beside it the maximum
received rate at the generator's top rate (MRR, the first trial).
"""
from __future__ import annotations

from pathlib import Path

from fathom.host.iperf import iperf3
from fathom.lab.lab import Lab
from fathom.lab.sh import run
from fathom.lab.topology import load

from . import rfc2544
from .devices import Names
from .engine import BenchError, Port, engine_args, mbps_for, run_engine

TOPOLOGY = Path(__file__).parent / "topologies" / "overlay.yaml"
PATHS = {"vxlan": ("vx1", "vx2"), "vlan": ("vl1", "vl2")}


def _vm(topo, name):
    for _, vm in topo.vms():
        if vm.name == name:
            return vm
    raise BenchError(f"overlay topology has no VM {name}")


def lab_name(names: Names) -> str:
    return f"{names.prefix}ov"


def run_overlay(plan, step, names: Names = Names()) -> tuple[list[dict], dict]:
    topo = load(TOPOLOGY)
    lab = Lab(lab_name(names))
    if lab.exists():
        lab.down()
    step(f"overlay: building lab {lab.name} (2 OVS nodes, VXLAN + VLAN)")
    lab.up(topo, str(TOPOLOGY), standalone=True)
    rows, extra = [], {"method": plan.search.describe()}
    try:
        # prime ARP / MAC learning and the tunnel neighbour table in both directions
        for src, dst in PATHS.values():
            ip = str(_vm(topo, dst).ip.ip)
            run(["ping", "-c", "3", "-i", "0.2", "-W", "1", ip], ns=lab.ns(src), check=False)
        extra["tnl_neigh_show"] = {n.name: lab.ovs(n.name).appctl("tnl/neigh/show", check=False)
                                   for n in lab.nodes()}
        extra["underlay_mtu"] = topo.underlay.mtu
        ceiling = 2e6
        for path, (src, dst) in PATHS.items():
            tx, rx = Port(lab.ns(src), "eth0"), Port(lab.ns(dst), "eth0", _vm(topo, dst).mac)
            for size in plan.tput_sizes:
                if size > 1518:
                    continue
                step(f"overlay: {path} throughput at {size} B")
                received: list[float] = []

                def trial(rate: float, seconds: float) -> tuple[float, float]:
                    r = run_engine(engine_args(tx, rx, size=size, rate_pps=rate, count=max(100, rate * seconds),
                                               dst_mac=rx.mac, stamp_every=0, linger_s=0.3,
                                               extra=["--spin-us", str(plan.spin_us)]))
                    received.append(r["rx"]["rx_pps"])
                    return r["tx"]["achieved_pps"], r["rx"]["loss_ratio"] or 0.0
                res = rfc2544.search(trial, ceiling, plan.search)
                mrr = received[0]
                rows.append({"module": "overlay", "path": path, "frame_size_bytes": size, **res.row(),
                             "throughput_mbps": round(mbps_for(res.throughput_pps, size), 3),
                             "max_received_pps": round(mrr, 1), "max_received_mbps": round(mbps_for(mrr, size), 3),
                             "trial_s": plan.search.trial_s, "final_trial_s": plan.search.final_s,
                             "wire_bytes_per_frame": size + (50 if path == "vxlan" else 4)})
            step(f"overlay: {path} TCP reference (iperf3)")
            extra[f"iperf3_{path}_gbps"] = _iperf(lab, src, str(_vm(topo, dst).ip.ip), dst)
        extra["tnl_neigh_show_after"] = {n.name: lab.ovs(n.name).appctl("tnl/neigh/show", check=False)
                                         for n in lab.nodes()}
        extra["ovs_version"] = lab.ovs("node1").version()
    finally:
        lab.down()
    return rows, extra


def _iperf(lab: Lab, src: str, ip: str, dst: str, seconds: int = 2) -> float | None:
    result = iperf3(lab.ns(src), lab.ns(dst), ip, seconds=seconds, check=False)
    return round(result.gbps, 3) if result else None
