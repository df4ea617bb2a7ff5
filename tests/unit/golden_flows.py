"""Desired flows of every shipped topology, in ovs-ofctl syntax, per switch.

Each topology (fathom/lab/topologies/*.yaml, fathom/bench/topologies/*.yaml) is registered through
the REST API the way `fathom lab up` registers it (nodes, the fabric switch, networks, subnets,
routers, VM ports, VNF ports and port pairs), plus two vTAP policies and, where there are VNFs, a
symmetric service chain; then the store's model is compiled for every switch a
reconcile pass programs: each node's br-int and br-phy and the fabric switch. Variants: without a fabric
switch, and with one in each router mode the topology can carry (network-node twice: while the
router namespace is being built, and once its interfaces are plugged). The default lab once more
with flow records sampled (`sampled`): its project's rates and one port's own.

Router interface and router gateway MACs (random in the store) become 02:fd:00:00:00:<id> and
02:fd:00:00:01:<router id>. OpenFlow port numbers are made up the same way every time: vxlan0 = 1,
patch-phy = 2, ext0 (the upstream host's node) = 3, VMs from 10
in topology order, then each VNF's ingress and egress, router interfaces of a network-node router from 100;
fabric switch port of the i-th node = i;
br-phy: patch-int = 1, ul0 = 2.

    .venv/bin/python -m tests.unit.golden_flows --write   # rewrite tests/unit/golden/flows.txt

tests/unit/test_golden_flows.py compares the listing against the committed file, so a change of
structure that changes any compiled flow, group, meter or cookie fails.
"""
from __future__ import annotations

import fcntl
import functools
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

from fathom.lab import topology

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden") / "flows.txt"
TOPOLOGIES = sorted((ROOT / "fathom/lab/topologies").glob("*.yaml")) + \
    sorted((ROOT / "fathom/bench/topologies").glob("*.yaml"))
SAMPLED = ROOT / "fathom/lab/topologies/default.yaml"     # also compiled with flow records sampled


def sampled(call, ids: dict) -> None:
    """Flow records of the VMs' project sampled (one in 100 sent and admitted, every drop), and vm1's
    own row (one in 1000 sent, drops off): a `more` for `model`."""
    project = call("GET", f"/ports/{ids['ports']['vm1']}")["project_id"]
    call("PUT", "/flow-records/config", json={"project_id": project, "ingress": 100, "admit": 100, "drop": 1})
    call("PUT", "/flow-records/config", json={"port_id": ids["ports"]["vm1"], "ingress": 1000})


def variants(topo: topology.Topology) -> list[tuple[str, bool, str]]:
    """(name, with a fabric switch, router mode) the topology can carry."""
    out = [("no-fabric", False, "distributed"), ("fabric distributed", True, "distributed")]
    if topo.routers:
        if all(topo.network(n).type == "vlan" for r in topo.routers for n in r.networks):
            out.append(("fabric mode=fabric", True, "fabric"))
        if any(n.role == "gateway" for n in topo.nodes) and not any(r.external_gateway for r in topo.routers):
            out.append(("fabric mode=network-node building", True, "network-node-building"))
            out.append(("fabric mode=network-node", True, "network-node"))
    return out


def register(client: TestClient, topo: topology.Topology, with_fabric: bool, mode: str, taps: bool = True) -> dict:
    """The lab's registration (fathom/lab/controller.py), through the API; returns names -> ids."""
    def call(method: str, path: str, project: str | None = None, **kw):
        r = client.request(method, "/v1" + path, headers={"X-Project": project} if project else {}, **kw)
        assert r.status_code < 400, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    ids: dict = {"nets": {}, "subnets": {}, "ports": {}, "routers": {}}
    for i, n in enumerate(topo.nodes):
        call("POST", "/nodes", json={"name": n.name, "role": n.role, "tunnel_ip": f"198.18.0.{i + 1}",
                                     "management_ip": f"198.18.100.{i + 1}"})
    if with_fabric:
        call("POST", "/fabric/switches", json={"name": "fabric", "management_ip": "198.18.100.250", "vlan_min": 1, "vlan_max": 4094,
                                               "links": {n.name: n.name for n in topo.nodes}})
    for net in topo.networks:
        body = {"name": net.name, "type": net.type, "project_id": net.project}
        if net.type != "flat":
            body["segmentation_id"] = topo.segmentation_id(net)
        if net.external:
            body["external"] = True
            if topo.upstream is not None and topo.upstream.network == net.name:
                body["upstream_mac"] = topo.upstream.mac
        nid = ids["nets"][net.name] = call("POST", "/networks", json=body)["id"]
        ids["subnets"][net.name] = call("POST", "/subnets", json={
            "network_id": nid, "cidr": str(net.cidr), "gateway_ip": str(net.gateway), "name": net.name,
            "project_id": net.project})["id"]
    for r in topo.routers:
        project = topo.network(r.networks[0]).project
        rid = ids["routers"][r.name] = call("POST", "/routers", json={"name": r.name, "project_id": project})["id"]
        for name in r.networks:
            call("POST", f"/routers/{rid}/interfaces", json={"subnet_id": ids["subnets"][name]})
        if mode != "distributed":
            call("PATCH", f"/routers/{rid}", json={"mode": mode.removesuffix("-building")})
        if r.external_gateway:
            call("PATCH", f"/routers/{rid}", json={"external_gateway": {"network_id": ids["nets"][r.external_gateway]}})
    for node in topo.nodes:
        for vm in node.vms:
            net = topo.network(vm.network)
            ids["ports"][vm.name] = call("POST", "/ports", json={
                "network_id": ids["nets"][vm.network], "name": vm.name, "mac_address": vm.mac,
                "fixed_ips": [{"subnet_id": ids["subnets"][vm.network], "ip_address": str(vm.ip.ip)}],
                "node": node.name, "interface_name": vm.name, "project_id": net.project})["id"]
            if vm.floating_ip:
                router = next(r for r in topo.routers if vm.network in r.networks and r.external_gateway)
                call("POST", "/floatingips", json={"floating_network_id": ids["nets"][router.external_gateway],
                                                   "port_id": ids["ports"][vm.name], "project_id": net.project})
    # VNFs as the lab registers them (two ports without port security, a port pair); and a symmetric
    # chain from the first VM to the last: the firewalls as one load-balanced group, then the next VNF
    vms = topo.vms()
    for node, vnf in topo.vnfs():
        net = topo.network(vnf.network)
        side = {}
        for s_, port in (("i", vnf.ingress), ("o", vnf.egress)):
            side[s_] = ids["ports"][f"{vnf.name}{s_}"] = call("POST", "/ports", json={
                "network_id": ids["nets"][vnf.network], "name": f"{vnf.name}{s_}", "mac_address": port.mac,
                "port_security": False, "node": node.name, "interface_name": f"{vnf.name}{s_}",
                "fixed_ips": [{"subnet_id": ids["subnets"][vnf.network], "ip_address": str(port.ip.ip)}],
                "project_id": net.project})["id"]
        ids.setdefault("pairs", {})[vnf.name] = call("POST", "/sfc/port_pairs", json={
            "name": vnf.name, "ingress": side["i"], "egress": side["o"], "project_id": net.project})["id"]
    if topo.vnfs() and len(vms) >= 2:
        vnfs = [v for _, v in topo.vnfs()]
        firewalls = [v for v in vnfs if v.kind == "firewall"] or vnfs[:1]
        groups = [firewalls] + [[v] for v in vnfs if v not in firewalls][:1]
        project = topo.network(vms[0][1].network).project
        gids = [call("POST", "/sfc/port_pair_groups", json={"port_pairs": [ids["pairs"][v.name] for v in g],
                                                            "project_id": project})["id"] for g in groups]
        fc = call("POST", "/sfc/flow_classifiers", json={
            "logical_source_port": ids["ports"][vms[0][1].name], "logical_destination_port": ids["ports"][vms[-1][1].name],
            "protocol": "tcp", "destination_port_range_min": 80, "destination_port_range_max": 80, "project_id": project})
        call("POST", "/sfc/port_chains", json={"port_pair_groups": gids, "flow_classifiers": [fc["id"]],
                                               "chain_parameters": {"symmetric": True}, "project_id": project})
    # vTAP: a filtered one-way policy to a monitor on another node, and a two-way one with two
    # monitors, truncation and a rate limit
    if taps and len(vms) >= 3:
        (n0, a), (_, b) = vms[0], vms[1]
        other = next(((n, v) for n, v in vms[2:] if n.name != n0.name), vms[2])[1]
        project = topo.network(a.network).project
        if topo.network(other.network).project == project:
            call("POST", "/taps", project=project, json={
                "name": "web", "sender": a.name, "receiver": {"mac": b.mac, "ip": str(b.ip.ip)}, "monitor": other.name,
                "ip_proto": 6, "tp_dst": "80-95"})
        same = [v for _, v in vms if topo.network(v.network).project == project and v.name != b.name]
        if len(same) >= 3:
            call("POST", "/taps", project=project, json={
                "name": "all", "sender": b.name, "receiver": a.name,
                "monitor": same[-1].name, "monitor2": same[-2].name, "direction": "both", "priority": 50,
                "truncate": 128, "rate_pps": 1000})
    return ids


def ofports(topo: topology.Topology, snapshot, mode: str) -> dict[str, dict[str, int]]:
    out = {}
    for node in topo.nodes:
        ports = {"vxlan0": 1, "patch-phy": 2}
        ports.update({vm.name: 10 + i for i, vm in enumerate(node.vms)})
        if topo.upstream is not None and topo.upstream.node == node.name:
            ports["ext0"] = 3
        for j, vnf in enumerate(node.vnfs):
            ports.update({f"{vnf.name}i": 10 + len(node.vms) + 2 * j, f"{vnf.name}o": 11 + len(node.vms) + 2 * j})
        out[node.name] = ports
    if mode == "network-node":
        gw = next(n.name for n in topo.nodes if n.role == "gateway")
        from fathom.model.routers import router_port_interface
        for i, ri in enumerate(sorted(snapshot.router_interfaces, key=lambda r: r.id)):
            out[gw][router_port_interface(ri.id)] = 100 + i
    return out


_MIGRATED: list = []    # (a temporary directory, the path of an empty store migrated once there)


def _migrated() -> str:
    """An empty store, migrated once per process: each model starts from a copy (migrating costs seconds)."""
    if not _MIGRATED:
        from fathom.api.app import create_app
        tmp = tempfile.TemporaryDirectory()
        app = create_app(f"sqlite:///{tmp.name}/fathom.db")
        app.state.engine.dispose()
        _MIGRATED.extend([tmp, f"{tmp.name}/fathom.db"])
    return _MIGRATED[1]


def model(path: Path, with_fabric: bool, mode: str, more=None):
    """(snapshot with runtime facts, {SwitchKey: desired state}) of a topology registered as the lab
    does; `more(call, ids)` makes further objects through the API first (`call(method, path,
    project=None, **kw)` as in `register`)."""
    from fathom.apps import compile_all
    snapshot = snapshot_of(path, with_fabric, mode, more)
    return snapshot, compile_all(snapshot)


def snapshot_of(path: Path, with_fabric: bool, mode: str, more=None):
    """The snapshot with runtime facts of a topology registered as the lab does (`more` as in `model`)."""
    from dataclasses import replace

    from sqlalchemy.orm import Session

    from fathom.api.app import create_app
    from fathom.store.snapshot import load_snapshot

    from .auth import headers_for

    topo = topology.load(path)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(_migrated(), f"{tmp}/fathom.db")
        app = create_app(f"sqlite:///{tmp}/fathom.db")
        with TestClient(app, headers=headers_for(app)) as client:
            ids = register(client, topo, with_fabric, mode)
            if more is not None:
                def call(method: str, url: str, project: str | None = None, **kw):
                    r = client.request(method, "/v1" + url, headers={"X-Project": project} if project else {}, **kw)
                    assert r.status_code < 400, f"{method} {url}: {r.status_code} {r.text}"
                    return r.json() if r.content else None
                more(call, ids)
        with Session(app.state.engine) as s:
            snapshot = load_snapshot(s)
        app.state.engine.dispose()
    # router interfaces get random MACs from the store: made fixed here
    snapshot = replace(snapshot, router_interfaces=tuple(
        replace(ri, mac_address=f"02:fd:00:00:00:{ri.id:02x}") for ri in snapshot.router_interfaces),
        router_gateways=tuple(replace(g, mac_address=f"02:fd:00:00:01:{g.router_id:02x}")
                              for g in snapshot.router_gateways))
    snapshot = snapshot.with_ofports(ofports(topo, snapshot, mode))
    snapshot = snapshot.with_phy_ofports({n.name: {"patch-int": 1, "ul0": 2} for n in topo.nodes})
    fab = snapshot.fabric
    if fab is not None:
        fabric_ports = {s.name: {n.name: i + 1 for i, n in enumerate(topo.nodes)} for s in fab.switches}
        snapshot = replace(snapshot, fabric=fab.with_ofports(fabric_ports))
    return snapshot


@functools.cache
def models() -> tuple:
    """(topology path, variant name, the model) of every shipped topology and variant, made once
    per test run (tests/unit/test_app_reads.py reads them too): the pytest-xdist workers of one run
    (PYTEST_XDIST_TESTRUNUID) share them through a file, the first to ask makes it."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return _make_models()
    shared = Path(tempfile.gettempdir()) / "fathom-golden-models"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        mine = shared / f"{run}.pickle"
        if mine.exists():
            return pickle.loads(mine.read_bytes())
        for old in shared.glob("*.pickle"):   # of runs that ended (none lasts a day)
            if time.time() - old.stat().st_mtime > 86400:
                old.unlink(missing_ok=True)
        made = _make_models()
        mine.write_bytes(pickle.dumps(made))
        return made


def _make_models() -> tuple:
    return tuple((path, name, snapshot_of(path, with_fabric, mode))
                 for path in TOPOLOGIES for name, with_fabric, mode in variants(topology.load(path))) + (
        (SAMPLED, "no-fabric sampled", snapshot_of(SAMPLED, False, "distributed", sampled)),)


def scenarios():
    """(topology path, variant name, {SwitchKey: desired state}) of every shipped topology and variant."""
    from fathom.apps import compile_all
    for path, name, snapshot in models():
        yield path, name, compile_all(snapshot)


def render() -> str:
    lines = []
    for path, name, states in scenarios():
        for key in sorted(states, key=str):
            lines.append(f"## {path.relative_to(ROOT)} [{name}] {key}")
            lines += states[key].to_ofctl()
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    text = render()
    if "--write" in sys.argv:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
        print(f"wrote {GOLDEN} ({text.count(chr(10))} lines)")
    else:
        sys.stdout.write(text)
