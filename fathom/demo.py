"""`make demo`: bring up the default lab, show traffic flowing, print a short report.

Run as `python -m fathom.demo [--keep]`. Each section adds one capability to the report.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time

from rich.console import Console

from fathom.lab.lab import Lab
from fathom.lab.sh import LabError
from fathom.lab.topology import DEFAULT_TOPOLOGY, load

console = Console()
LAB = "demo"


def in_ns(lab: Lab, target: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    argv, env = lab.exec_args(target, list(cmd))
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def ping_rtt_ms(lab: Lab, src: str, dst: str) -> float | None:
    out = in_ns(lab, src, "ping", "-c", "5", "-i", "0.2", "-W", "1", dst).stdout
    m = re.search(r"= [\d.]+/([\d.]+)/", out)
    return float(m.group(1)) if m else None


def iperf_gbps(lab: Lab, client: str, server: str, server_ip: str, seconds: int = 3) -> float | None:
    srv = subprocess.Popen(["ip", "netns", "exec", lab.ns(server), "iperf3", "-s", "-1", "-B", server_ip],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = in_ns(lab, client, "iperf3", "-c", server_ip, "-t", str(seconds), "-J")
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9 if out.returncode == 0 else None
    finally:
        srv.kill()


def lab_section(lab: Lab, report: list) -> None:
    console.rule("[bold]the emulated cloud (standalone, NORMAL switching over VXLAN)")
    topo = load(DEFAULT_TOPOLOGY)
    with console.status("bringing up the default lab"):
        t0 = time.monotonic()
        lab.up(topo, str(DEFAULT_TOPOLOGY), standalone=True)
        report.append(("lab up", f"{time.monotonic() - t0:.1f} s: {len(topo.nodes)} nodes, 4 VMs, 1 fabric switch"))
    ips = {vm.name: str(vm.ip.ip) for _, vm in topo.vms()}
    for label, src, dst in (("same node", "vm1", "vm2"), ("cross node (VXLAN)", "vm1", "vm3")):
        rtt = ping_rtt_ms(lab, src, ips[dst])
        console.print(f"ping {src} → {dst} ({label}): " + (f"[green]ok[/green], avg {rtt:.3f} ms" if rtt else "[red]FAILED"))
        report.append((f"ping {label}", f"{rtt:.3f} ms avg" if rtt else "FAILED"))
    gbps = iperf_gbps(lab, "vm1", "vm3", ips["vm3"])
    console.print(f"iperf3 TCP vm1 → vm3 across nodes: {gbps:.2f} Gb/s" if gbps else "iperf3: [red]FAILED")
    report.append(("TCP vm1 → vm3 (VXLAN)", f"{gbps:.2f} Gb/s" if gbps else "FAILED"))
    neigh = in_ns(lab, "compute1", "ovs-appctl", "tnl/neigh/show").stdout.strip().splitlines()[2:]
    console.print("compute1 tunnel neighbours (ARP-learned IP-MAC table):\n  " + "\n  ".join(neigh))
    report.append(("tunnel neighbours on compute1", ", ".join(" ".join(l.split()[:2]) for l in neigh)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the lab up (fathom lab down -n demo)")
    args = parser.parse_args()
    lab = Lab(LAB)
    if lab.exists():
        console.print(f"removing a previous demo lab")
        lab.down()
    report: list[tuple[str, str]] = []
    ok = True
    try:
        lab_section(lab, report)
    except (LabError, subprocess.SubprocessError) as e:
        console.print(f"[red]demo failed:[/red] {e}")
        ok = False
    finally:
        console.rule("[bold]report")
        for k, v in report:
            console.print(f"  {k:<34} {v}")
        if args.keep and ok:
            console.print(f"\nlab '{LAB}' left up: try 'fathom lab status -n {LAB}'; remove it with 'fathom lab down -n {LAB}'")
        else:
            lab.down()
            console.print(f"\nlab '{LAB}' removed")
    return 0 if ok and all("FAILED" not in v for _, v in report) else 1


if __name__ == "__main__":
    sys.exit(main())
