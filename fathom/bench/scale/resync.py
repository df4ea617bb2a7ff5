"""`fathom bench scale`, full resync of a real OVS bridge: a lab whose controller speaks OpenFlow
and OVSDB over TLS, as on real hosts; its bridge wiped and restored (`resync_real`)."""
from __future__ import annotations

import re
import subprocess
import time

from fathom.bench.procs import cpu_seconds
from fathom.bench.report import dist
from fathom.client import Client
from fathom.host.exec import argv

from .common import create_parallel


def resync_real(lab_name: str, ports: int = 10000, repeats: int = 3, progress=lambda msg: None) -> dict:
    """A real OVS bridge wiped and restored: a lab of two nodes (fathom/bench/topologies/tenant.yaml)
    under its own controller, `ports` ports bound to compute2 (each one L2 flow on compute1), then
    `repeats` times: `ovs-ofctl del-flows` on compute1's br-int and one reconcile pass
    (POST /v1/sync) that reads the bridge back and puts every flow in again; flows/s of that pass,
    and the controller's CPU time in it."""
    from fathom.bench.tenant import TOPOLOGY
    from fathom.lab.lab import Lab
    from fathom.lab.topology import load
    lab = Lab(lab_name)
    lab.down()
    try:
        progress(f"resync: lab {lab_name} up")
        state = lab.up(load(TOPOLOGY), str(TOPOLOGY))       # OpenFlow and OVSDB over TLS, as on real hosts
        pid = state["controller"]["pid"]

        class _Clients:
            def client(self):
                return Client.for_lab(state, timeout=120)
        api = Client.for_lab(state, timeout=600)
        ovs = lab.ovs("compute1")

        def flow_count() -> int:
            return int(re.search(r"flow_count=(\d+)", ovs.ofctl("dump-aggregate", "br-int")).group(1))

        net = next(n["id"] for n in api.get("/networks") if n["name"] == "blue")
        progress(f"resync: creating {ports} ports")
        create_parallel(_Clients(), [{"network_id": net, "name": f"bulk{i}", "node": "compute2",
                                       "interface_name": f"bulk{i}", "fixed_ips": [],
                                       "mac_address": f"02:bf:{i >> 16 & 0xff:02x}:{i >> 8 & 0xff:02x}:{i & 0xff:02x}:01"}
                                      for i in range(ports)])
        api.post("/sync")                       # every flow in place before the first wipe
        installed = flow_count()
        of_port = state["controller"]["of_port"]

        def connections(kill: bool = False) -> int:
            """compute1's OpenFlow connections to the controller (`kill`: cut them, as ss -K does)."""
            out = subprocess.run(argv(["ss", "-tnH", *(["-K"] if kill else []), "state", "established",
                                       f"( dport = :{of_port} )"], ovs.netns),
                                 capture_output=True, text=True, check=True).stdout
            return len(out.splitlines())
        runs = []
        for r in range(repeats):
            # (a) the switch comes back with empty tables, as after an ovs-vswitchd restart: its flows
            # wiped, its connections cut; OVS reconnects after its own backoff, the controller
            # reconciles that switch alone. Timed from the cut, and from the reconnection (OVS's
            # backoff is not the controller's), until the bridge holds every flow again.
            progress(f"resync: reconnect with empty tables {r + 1}/{repeats} ({installed} flows)")
            ovs.ofctl("del-flows", "br-int")
            cpu0 = cpu_seconds(pid)
            held = connections()
            t = time.perf_counter()
            connections(kill=True)
            while connections() < held and time.perf_counter() - t < 60:
                time.sleep(0.01)
            connected = time.perf_counter() - t
            while (restored := flow_count()) < installed and time.perf_counter() - t < 120:
                time.sleep(0.02)
            seconds = time.perf_counter() - t
            runs.append({"how": "reconnect", "flows": restored, "seconds": seconds,
                         "reconnect_seconds": connected, "flows_per_second": restored / seconds,
                         "after_reconnect_flows_per_second": restored / max(seconds - connected, 1e-3),
                         "controller_cpu_s": cpu_seconds(pid) - cpu0, "complete": restored == installed})
            # (b) wiped under a connected controller, then one audit pass (POST /v1/sync) that reads
            # every switch back
            progress(f"resync: del-flows and an audit pass {r + 1}/{repeats}")
            ovs.ofctl("del-flows", "br-int")
            cpu0 = cpu_seconds(pid)
            t = time.perf_counter()
            nodes = api.post("/sync")
            seconds = time.perf_counter() - t
            restored = flow_count()
            # sending the change to compute1; unknown when that pass did not send it (the periodic
            # check noticed the wipe first and restored it)
            sent = nodes["compute1"].get("changes", 0) >= installed
            apply_s = (nodes["compute1"].get("apply_seconds") or None) if sent else None
            runs.append({"how": "audit", "flows": restored, "seconds": seconds,
                         "flows_per_second": restored / seconds, "controller_cpu_s": cpu_seconds(pid) - cpu0,
                         "apply_seconds": apply_s, "apply_flows_per_second": restored / apply_s if apply_s else None,
                         "complete": restored == installed})
        return {"lab": lab_name, "ports": ports, "flows_on_bridge": installed, "runs": runs,
                "reconnect_flows_per_second": dist([x["flows_per_second"] for x in runs if x["how"] == "reconnect"]),
                "after_reconnect_flows_per_second": dist([x["after_reconnect_flows_per_second"] for x in runs
                                                          if x["how"] == "reconnect"]),
                "audit_flows_per_second": dist([x["flows_per_second"] for x in runs if x["how"] == "audit"]),
                "apply_flows_per_second": dist([x["apply_flows_per_second"] for x in runs
                                                if x.get("apply_flows_per_second")])}
    finally:
        lab.down()
