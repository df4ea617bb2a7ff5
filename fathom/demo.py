"""`make demo`: bring up the default lab, show traffic flowing, print a short report.

Run as `python -m fathom.demo [--keep]`. Each section adds one capability to the report.
`--openstack` (`make demo-openstack`) runs the OpenStack section alone: a real Neutron driving
fathom (fathom/openstack_demo.py).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from fathom.client import ApiError, Client

from rich.console import Console

from fathom.host import exec as host_exec
from fathom.host.iperf import iperf3
from fathom.lab.capture import Capture
from fathom.lab.lab import Lab
from fathom.pptmon import demo as pptmon_demo
from fathom.lab.sh import LabError
from fathom.lab.topology import DEFAULT_TOPOLOGY, load

console = Console(width=None if sys.stdout.isatty() else 130)
LAB = "demo"
KEEP = False
TOPOLOGIES = Path(__file__).parent / "lab" / "topologies"


def ping_rtt_ms(lab: Lab, src: str, dst: str) -> float | None:
    out = lab.run(src, "ping", "-c", "5", "-i", "0.2", "-W", "1", dst).stdout
    m = re.search(r"= [\d.]+/([\d.]+)/", out)
    return float(m.group(1)) if m else None


def iperf_gbps(lab: Lab, client: str, server: str, server_ip: str, seconds: int = 3) -> float | None:
    result = iperf3(lab.ns(client), lab.ns(server), server_ip, seconds=seconds, check=False)
    return result.gbps if result else None


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
    neigh = lab.run("compute1", "ovs-appctl", "tnl/neigh/show").stdout.strip().splitlines()[2:]
    console.print("compute1 tunnel neighbours (ARP-learned IP-MAC table):\n  " + "\n  ".join(neigh))
    report.append(("tunnel neighbours on compute1", ", ".join(" ".join(l.split()[:2]) for l in neigh)))


def tenant_section(report: list) -> None:
    """Two tenants with the same subnet, a router, traffic across nodes, all under the controller."""
    console.rule("[bold]tenant networking under the controller")
    lab = Lab(LAB + "t")
    lab.down()
    path = TOPOLOGIES / "tenants.yaml"
    topo = load(path)
    try:
        with console.status("bringing up the tenants lab with its own controller"):
            t0 = time.monotonic()
            state = lab.up(topo, str(path))
        url = state["controller"]["url"]
        api = Client.for_lab(state)
        ports = api.list("/ports")
        active = sum(p["status"] == "active" for p in ports)
        console.print(f"controller {url}: {active}/{len(ports)} ports active after {time.monotonic() - t0:.1f} s")
        report.append(("tenant lab up (controller)", f"{time.monotonic() - t0:.1f} s, {active}/{len(ports)} ports active"))
        ips = {vm.name: str(vm.ip.ip) for _, vm in topo.vms()}
        checks = [("blue vm1 → vm3, cross node (VXLAN 1001)", "vm1", "vm3"),
                  ("red red1 → red3, same IPs as blue (VXLAN 1002)", "red1", "red3"),
                  ("green grn1 → grn2, cross node (VLAN 120)", "grn1", "grn2"),
                  ("routed blue vm1 → green grn2 (router r1)", "vm1", "grn2")]
        for label, src, dst in checks:
            out = lab.run(src, "ping", "-c", "3", "-i", "0.2", "-W", "1", ips[dst]).stdout
            m = re.search(r"ttl=(\d+).*?time=([\d.]+)", out)
            ok = " 0% packet loss" in out
            console.print(f"{label}: " + (f"[green]ok[/green] ttl={m.group(1)}" if ok and m else "[red]FAILED"))
            report.append((label, f"ok, ttl={m.group(1)}" if ok and m else "FAILED"))
        gbps = iperf_gbps(lab, "vm1", "grn2", ips["grn2"])
        report.append(("TCP vm1 → grn2 routed, cross node", f"{gbps:.2f} Gb/s" if gbps else "FAILED"))
        console.print(f"iperf3 TCP routed vm1 → grn2: {gbps:.2f} Gb/s" if gbps else "iperf3: [red]FAILED")
        for node in ("compute1", "compute2"):
            flows = api.node_flows(node)
            n = sum(len(v) for v in flows["desired"].values())
            report.append((f"flows on {node}", f"{n} desired, {'in sync' if flows['in_sync'] else 'NOT in sync - FAILED'}"))
    finally:
        if not KEEP:
            lab.down()


VTAP_TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1001, cidr: 198.19.1.0/24}
nodes:
  - name: compute1
    role: compute
    vms:
      - {name: client, mac: "02:fa:00:00:01:01", ip: 198.19.1.11/24, network: blue}
      - {name: ids, mac: "02:fa:00:00:01:a1", ip: 198.19.1.101/24, network: blue}
  - name: compute2
    role: compute
    vms:
      - {name: web, mac: "02:fa:00:00:01:02", ip: 198.19.1.12/24, network: blue}
underlay:
  cidr: 198.18.0.0/24
  mtu: 1600
"""


def vtap_section(report: list) -> None:
    """vTAP: one tenant's HTTP traffic (client -> web, both directions) copied to a monitor VM."""
    from fathom.lab.topology import parse
    console.rule("[bold]vTAP: HTTP of one tenant copied to a monitor VM (group ALL + recovery rule)")
    lab = Lab(LAB + "v")
    lab.down()
    try:
        with console.status("bringing up a lab with a monitor VM"):
            api = Client.for_lab(lab.up(parse(VTAP_TOPOLOGY, "<demo vtap>"), "<demo vtap>"))
        tid = api.post("/taps", json={"name": "http", "sender": "client", "receiver": "web", "monitor": "ids",
                                      "direction": "both", "ip_proto": "tcp", "tp_dst": 80})["id"]
        api.wait_until(f"/taps/{tid}/stats", lambda s: s.get("realised"), timeout=20, interval=0.3)
        srv = subprocess.Popen(host_exec.argv(["python3", "-m", "http.server", "80", "--bind", "198.19.1.12"],
                                              lab.ns("web")), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cap = Capture(lab.ns("ids"), "eth0", f"/tmp/{LAB}v-ids.pcap", "tcp port 80").start()
        try:
            deadline = time.monotonic() + 15   # until the web server listens
            while "198.19.1.12:80" not in lab.run("web", "ss", "-ltn").stdout and time.monotonic() < deadline:
                time.sleep(0.2)
            ok = sum(lab.run("client", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                             "http://198.19.1.12/").stdout == "200" for _ in range(5))
            lab.run("client", "ping", "-c", "2", "-i", "0.2", "198.19.1.12")   # not HTTP: not copied
        finally:
            cap.stop()
            srv.kill()
        summary = cap.report.strip().splitlines()
        captured = next((l.split()[0] for l in summary if "captured" in l), "?")
        stats = [api.tap_stats(t["id"]) for t in api.get("/taps")]
        copies = sum(s["copies_packets"] for s in stats)
        delivered = sum(s["delivered_packets"] for s in stats)
        console.print(f"5 HTTP GETs client → web (cross node): {ok}/5 answered; monitor 'ids' captured "
                      f"{captured} HTTP frames; counters: {copies} copies made, {delivered} delivered", highlight=False)
        console.print(f"  fathom tap list / fathom tap show http --controller {api.url}", highlight=False)
        report.append(("vTAP HTTP client → web to ids", f"{ok}/5 GETs ok, {captured} frames at the monitor, "
                       f"{copies} copies / {delivered} delivered" + ("" if ok == 5 and copies and copies == delivered
                                                                     else " FAILED")))
    finally:
        if not KEEP:
            lab.down()


def fabric_section(report: list) -> None:
    """The fabric switch under the controller (LLDP, VLANs on its trunks), one router moved between
    the three modes while a ping runs through it: traffic follows the router."""
    console.rule("[bold]fabric offload: the fabric switch under the controller, router modes")
    from fathom.bench.l3 import TOPOLOGY as FABRIC_TOPOLOGY
    lab = Lab(LAB + "f")
    lab.down()
    topo = load(FABRIC_TOPOLOGY)
    try:
        with console.status("bringing up the fabric lab (fabric switch managed by the controller)"):
            state = lab.up(topo, str(FABRIC_TOPOLOGY))
        api = Client.for_lab(state)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            st = api.get("/fabric/switches/1/status")
            if all("lldp" in p["link"] for p in st["ports"]):
                break
            time.sleep(0.5)
        for p in st["ports"]:
            line = f"fabric switch port {p['port']} → node {p['node']} (by {'+'.join(p['link'])}), VLANs {p['vlans']}"
            console.print(line)
            report.append((f"fabric switch port {p['port']}", f"node {p['node']} by {'+'.join(p['link']) or 'FAILED'}, "
                                                    f"VLANs {p['vlans']}"))
        rid = api.get("/routers")[0]["id"]
        ips = {vm.name: str(vm.ip.ip) for _, vm in topo.vms()}
        for mode in ("fabric", "network-node", "distributed"):
            # a ping every 10 ms while the router moves: how many echoes the move costs
            argv, env = lab.exec_args("va", ["ping", "-i", "0.01", "-W", "1", ips["vd"]])
            pinger = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            time.sleep(0.5)
            api.patch(f"/routers/{rid}", json={"mode": mode})
            try:
                api.wait_status("routers", rid, "active", timeout=10)
            except ApiError:
                pass   # reported below by the echoes lost and the throughput
            time.sleep(1)
            pinger.send_signal(2)
            out = pinger.communicate(timeout=5)[0]
            m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
            lost = f"{int(m.group(1)) - int(m.group(2))}/{m.group(1)}" if m else "?"
            gbps = iperf_gbps(lab, "va", "vd", ips["vd"], seconds=2)
            where = {"fabric": "the fabric switch's flows (svi table)", "network-node": "a router namespace on gw",
                     "distributed": "the first-hop node's br-int"}[mode]
            console.print(f"router r1 → {mode}: va → vd routed by {where}; echoes lost in the move {lost}; TCP "
                          + (f"{gbps:.2f} Gb/s" if gbps else "[red]FAILED"))
            ok = m is not None and int(m.group(1)) - int(m.group(2)) <= 3 and gbps
            report.append((f"router r1 moved to {mode}", f"{lost} echoes lost (10 ms apart), TCP va → vd "
                                                         f"{gbps or 0:.2f} Gb/s" + ("" if ok else " - FAILED")))
    finally:
        if not KEEP:
            lab.down()


SFC_TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1301, cidr: 198.19.30.0/24}
nodes:
  - name: compute1
    vms:
      - {name: client, mac: "02:fa:00:00:1e:0b", ip: 198.19.30.11/24, network: blue}
    vnfs:
      - {name: fw, kind: firewall, rules: 20, network: blue, plug: hybrid,
         ingress: {mac: "02:fb:00:00:1e:65", ip: 198.19.30.101/24}, egress: {mac: "02:fb:00:00:1e:66", ip: 198.19.30.102/24}}
  - name: compute2
    vms:
      - {name: server, mac: "02:fa:00:00:1e:15", ip: 198.19.30.21/24, network: blue}
    vnfs:
      - {name: dpi, kind: dpi, network: blue, plug: hybrid,
         ingress: {mac: "02:fb:00:00:1e:69", ip: 198.19.30.105/24}, egress: {mac: "02:fb:00:00:1e:6a", ip: 198.19.30.106/24}}
      - {name: nat, kind: nat, network: blue, plug: hybrid,
         ingress: {mac: "02:fb:00:00:1e:6d", ip: 198.19.30.109/24}, egress: {mac: "02:fb:00:00:1e:6e", ip: 198.19.30.110/24}}
underlay:
  cidr: 198.18.30.0/24
  mtu: 1600
"""


def sfc_section(report: list) -> None:
    """A service chain fw → dpi → nat across two nodes, measured by PPTMon through the API: the
    agents attach the programs on the VNFs' taps (hybrid-plugged: tap → Linux bridge → veth → br-int,
    which works on the lab's userspace datapath), the controller files the records under the chain."""
    from fathom.lab import vnf as vnfs
    from fathom.lab.topology import parse
    console.rule("[bold]service chain fw → dpi → nat across two nodes, measured by PPTMon (API)")
    lab = Lab(LAB + "s")
    lab.down()
    try:
        with console.status("bringing up a lab with three VNFs under the controller"):
            state = lab.up(parse(SFC_TOPOLOGY, "<demo sfc>"), "<demo sfc>")
        api = Client.for_lab(state)
        created = state["controller"]["created"]
        www = lab.dir / "www"
        www.mkdir(exist_ok=True)
        (www / "blob").write_bytes(bytes(200_000))
        vnfs.start_web(lab.ns("server"), lab.dir / "server-web", www)
        default = next(g for g in api.get("/security-groups") if g["project_id"] == "demo" and g["name"] == "default")
        api.post("/security-group-rules", json={   # the server admits the NAT's address
            "security_group_id": default["id"], "direction": "ingress", "ethertype": "IPv4", "protocol": "tcp",
            "port_range_min": 80, "port_range_max": 80, "remote_ip_prefix": "198.19.30.110/32"})
        groups = [api.post("/sfc/port_pair_groups", json={"name": v, "port_pairs": [created["port_pairs"][v]],
                                                            "project_id": "demo"})["id"] for v in ("fw", "dpi", "nat")]
        fc = api.post("/sfc/flow_classifiers", json={
            "name": "web", "protocol": "tcp", "destination_port_range_min": 80, "destination_port_range_max": 80,
            "logical_source_port": created["ports"]["client"], "project_id": "demo"})["id"]
        chain = api.post("/sfc/port_chains", json={"name": "web", "port_pair_groups": groups, "flow_classifiers": [fc],
                                                     "project_id": "demo", "pptmon": {"period_ns": 5_000_000}})
        st = api.wait_status("sfc/port_chains", chain["id"], timeout=40)
        ok = sum(lab.run("client", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                         "http://198.19.30.21/blob").stdout == "200" for _ in range(5))
        console.print(f"5 HTTP GETs client → server through fw → dpi → nat: {ok}/5 answered", highlight=False)
        report.append(("chain fw → dpi → nat across 2 nodes", f"{ok}/5 GETs answered" + ("" if ok == 5 else " FAILED")))
        if st["status"] != "active":
            console.print(f"port chain {chain['id']} with pptmon: [red]{st['status']}[/red]: "
                          f"{st['status_reason']}", highlight=False)
            report.append(("PPTMon on the chain", f"FAILED: {st['status_reason']}"))
            return
        deadline = time.monotonic() + 20
        while True:
            stats = api.get(f"/sfc/port_chains/{chain['id']}/pptmon", params={"window": "5m"})
            if all(g["processing"]["count"] for g in stats["groups"]) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        console.print(f"PPTMon (1 sample / 5 ms): {stats['records']} records at the controller", highlight=False)
        for g in stats["groups"]:
            p, pair = g["processing"], g["port_pairs"][0]
            line = (f"p50 {p['p50_us']:.0f} µs, p99 {p['p99_us']:.0f} µs ({p['count']} samples)" if p["count"]
                    else "no samples - FAILED")
            console.print(f"  {g['name']:<4} ({g['role']}, node {pair['node']}): {line}", highlight=False)
            report.append((f"PPTMon chain hop {g['name']} on {pair['node']}", line))
        e = stats["e2e"]
        e2e = f"p50 {e['p50_us']:.0f} µs, p99 {e['p99_us']:.0f} µs ({e['count']} packets)" if e["count"] else "FAILED"
        console.print(f"  end to end: {e2e}", highlight=False)
        console.print(f"  fathom sfc port-chain pptmon web --controller {api.url}", highlight=False)
        report.append(("PPTMon chain fw → dpi → nat end to end", e2e))
    finally:
        if not KEEP:
            lab.down()


def pptmon_chain() -> str:
    """The PPTMon section's chain: 'pp' and the demo's lab name ('ppdemo' by default)."""
    return "pp" + LAB


def set_lab_name(name: str) -> None:
    global LAB
    LAB = name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the lab up (fathom lab down -n demo)")
    parser.add_argument("--name", default=LAB, help="name of the demo's lab; its other labs add one letter and "
                                                     "its PPTMon chain is 'pp' + NAME (at most 7 characters, so that "
                                                     "several demos can run at once)")
    parser.add_argument("--openstack", action="store_true",
                        help="only the OpenStack section: a real Neutron with fathom's drivers, driven by the "
                             "`openstack` command line (a few minutes; lab NAME + 'o')")
    args = parser.parse_args()
    set_lab_name(args.name)
    report: list[tuple[str, str]] = []
    if args.openstack:
        return openstack(report, args.keep)
    lab = Lab(LAB)
    if lab.exists():
        console.print("removing a previous demo lab")
        lab.down()
    ok = True
    global KEEP
    KEEP = args.keep
    try:
        lab_section(lab, report)
        tenant_section(report)
        vtap_section(report)
        fabric_section(report)
        sfc_section(report)
        pptmon_demo.section(console, report, keep=args.keep, name=pptmon_chain())
    except Exception as e:  # noqa: BLE001 - the report and the clean-up below must still happen
        if not isinstance(e, (LabError, ApiError, subprocess.SubprocessError)):
            console.print_exception()
        console.print(f"[red]demo failed:[/red] {e}")
        ok = False
    finally:
        print_report(report)
        labs = [LAB, LAB + "t", LAB + "v", LAB + "f", LAB + "s"]
        if args.keep and ok:
            console.print(f"\nlabs {', '.join(labs)} and PPTMon chain {pptmon_chain()} left up: try "
                          f"'fathom lab status -n {LAB}t'; remove them with 'fathom lab down -n NAME' and "
                          f"'fathom pptmon chain down {pptmon_chain()}'")
        else:
            for name in labs:
                Lab(name).down()
            console.print(f"\nlabs {', '.join(labs)} removed")
    return 0 if ok and all("FAILED" not in v for _, v in report) else 1


def print_report(report: list) -> None:
    console.rule("[bold]report")
    for k, v in report:
        console.print(f"  {k:<48} {v}", highlight=False)


def openstack(report: list, keep: bool) -> int:
    """The OpenStack section alone; it removes its lab and Neutron server itself (unless `keep`)."""
    from fathom import openstack_demo
    ok = True
    try:
        openstack_demo.section(console, report, LAB + "o", keep=keep)
    except Exception as e:  # noqa: BLE001 - the report must still be printed
        if not isinstance(e, (LabError, ApiError, subprocess.SubprocessError)):
            console.print_exception()
        console.print(f"[red]demo failed:[/red] {e}")
        ok = False
    print_report(report)
    if not (keep and ok):
        console.print(f"\nlab {LAB}o and its Neutron server removed")
    return 0 if ok and all("FAILED" not in v for _, v in report) else 1


if __name__ == "__main__":
    sys.exit(main())
