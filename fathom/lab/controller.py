"""A lab under a controller: start one for the lab (unless given), register nodes and the topology.

The lab's objects are created through the REST API exactly as an operator would, and their ids are
kept in the lab's state so that `fathom lab down` removes them from the controller again.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fathom.auth.client import NoToken, read_token_file
from fathom.auth.tokens import ADMIN_TOKEN_FILE
from fathom.client import ApiError, Client

from .sh import LabError
from .topology import Topology, ovs_interface


START_TIMEOUT = 60    # seconds for a starting controller to answer (a busy two-core host needs tens)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_controller(lab_dir: Path, of_host: str, api_port: int | None = None, of_port: int | None = None,
                     pki_dir: str | None = None, db: str | None = None, replicas: int = 1,
                     options: tuple[str, ...] = ()) -> dict:
    """A controller process for this lab: its store (a SQLite file unless `db`), log and pid file
    live in the lab's run dir.

    With `pki_dir` it speaks TLS on OpenFlow and OVSDB, otherwise plain TCP (--insecure).
    Given the ports of a previous run (a restart), it comes back where the switches expect it.
    With `replicas` > 1: that many controllers, `fathom controller --cluster` on the PostgreSQL
    store `db`, started one after the other; the first is the lab's controller (its URL, its
    agents' URLs: all of them), every one is listed under "replicas" (replica i > 0 logs to controller-<i>.log).
    `options`: more `fathom controller` arguments (a single controller's; kept for its restart).
    """
    if replicas > 1:
        if not db or not db.startswith("postgresql"):
            raise LabError("controller replicas share a PostgreSQL store: give its URL (--db postgresql+psycopg://...)")
        started = [_start(lab_dir, of_host, None, None, pki_dir, db, index=i, cluster=True) for i in range(replicas)]
        # the agents take every replica and fail over (fathom.agent.http)
        return {**started[0], "replicas": started, "agent_url": ",".join(r["agent_url"] for r in started)}
    return _start(lab_dir, of_host, api_port, of_port, pki_dir, db, options=options)


def start_replica(lab_dir: Path, replica: dict, index: int) -> dict:
    """Replica `index` of the lab's cluster started again where it ran (`replica`: its entry in the
    lab's state): same API and OpenFlow ports, same store."""
    return _start(lab_dir, replica["of_host"], replica["api_port"], replica["of_port"], replica["pki_dir"],
                  replica["db"], index=index, cluster=True)


def _start(lab_dir: Path, of_host: str, api_port: int | None, of_port: int | None, pki_dir: str | None,
           db: str | None, index: int = 0, cluster: bool = False, options: tuple[str, ...] = ()) -> dict:
    """One controller process (`index`: which replica of a cluster; 0: the first, or a lone one)."""
    suffix = f"-{index}" if index else ""
    api_port, of_port = api_port or free_port(), of_port or free_port(of_host)
    log = open(lab_dir / f"controller{suffix}.log", "ab")
    fathom = Path(sys.executable).with_name("fathom")
    cmd = [str(fathom) if fathom.exists() else sys.executable, *([] if fathom.exists() else ["-m", "fathom.cli.main"]),
           "controller", "--db", db or f"sqlite:///{lab_dir}/fathom.db", "--api-port", str(api_port),
           # the API also on the management network, where the nodes' agents reach it
           "--api-host", "127.0.0.1", *(["--api-host", of_host] if of_host != "127.0.0.1" else []),
           "--of-host", of_host, "--of-port", str(of_port), "--interval", "10",
           "--state-dir", str(lab_dir), *(["--pki-dir", pki_dir] if pki_dir else ["--insecure"]),
           *(["--cluster"] if cluster else []), *options]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (lab_dir / f"controller{suffix}.pid").write_text(str(proc.pid))
    url = f"http://127.0.0.1:{api_port}"
    token_file = lab_dir / ADMIN_TOKEN_FILE     # the controller's admin credential (0600), written at start
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabError(f"the controller exited ({proc.returncode}); see {lab_dir / f'controller{suffix}.log'}")
        try:
            probe = Client(url, token=read_token_file(token_file), timeout=1)
            try:
                probe.health()
            finally:
                probe.close()
            return {"url": url, "agent_url": f"http://{of_host}:{api_port}", "pid": proc.pid, "api_port": api_port, "of_port": of_port, "of_host": of_host,
                    "managed": True, "pki_dir": pki_dir, "token_file": str(token_file), **({"db": db} if db else {}),
                    **({"options": list(options)} if options else {})}
        except (ApiError, NoToken):
            time.sleep(0.2)
    raise LabError(f"the controller did not answer on {url} within {START_TIMEOUT} s; see {lab_dir / f'controller{suffix}.log'}")


def stop_controller(lab_dir: Path) -> None:
    """Stop the lab's controller, every replica of it."""
    from .ovs import kill_and_wait
    for pid_file in sorted(lab_dir.glob("controller*.pid")):
        try:
            kill_and_wait(int(pid_file.read_text()), timeout=5)
        except (OSError, ValueError):
            pass


def register(url: str, topo: Topology, nodes: list, progress=lambda s: None, fabric_ip: str | None = None,
             switches_registered=lambda created: None, token: str | None = None) -> dict:
    """Create nodes, networks, subnets, routers, VM ports, VNF ports and their port pairs; returns the
    ids created.

    `switches_registered(created)` runs once the nodes and the fabric switch have their ids (e.g. to
    issue their certificates, which bind the datapath ids derived from them)."""
    try:
        return _register(Client(url, token=token), topo, nodes, progress, fabric_ip, switches_registered)
    except ApiError as e:
        raise LabError(f"controller: {e}") from None


def _register(api: Client, topo: Topology, nodes: list, progress, fabric_ip: str | None,
              switches_registered) -> dict:
    created: dict[str, dict[str, int]] = {"nodes": {}, "networks": {}, "subnets": {}, "ports": {}, "routers": {},
                                          "fabric_switches": {}, "floatingips": {}}
    progress("registering nodes")
    for n in nodes:
        created["nodes"][n.name] = api.request("POST", "/nodes", json={
            "name": n.name, "role": n.role, "tunnel_ip": n.tunnel_ip, "management_ip": n.mgmt_ip})["id"]
    if fabric_ip:
        # the fabric switch; the lab's wiring (port named after the node) is declared as a fallback,
        # the controller learns the real one by LLDP
        progress("registering the fabric switch")
        created["fabric_switches"]["fabric"] = api.request("POST", "/fabric/switches", json={
            "name": "fabric", "management_ip": fabric_ip, "links": {n.name: n.name for n in nodes}})["id"]
    switches_registered(created)
    progress("creating networks")
    for net in topo.networks:
        body = {"name": net.name, "type": net.type, "project_id": net.project}
        if net.type != "flat":
            body["segmentation_id"] = topo.segmentation_id(net)
        if net.external:
            body["external"] = True
            if topo.upstream is not None and topo.upstream.network == net.name:
                body["upstream_mac"] = topo.upstream.mac
        nid = created["networks"][net.name] = api.request("POST", "/networks", json=body)["id"]
        created["subnets"][net.name] = api.request("POST", "/subnets", json={
            "network_id": nid, "cidr": str(net.cidr), "gateway_ip": str(net.gateway), "name": net.name,
            "project_id": net.project, "enable_dhcp": topo.dhcp(net), "dns_nameservers": [str(ip) for ip in net.dns],
            "host_routes": [{"destination": str(r.destination), "nexthop": str(r.nexthop)} for r in net.host_routes],
        })["id"]
    for r in topo.routers:
        project = topo.network(r.networks[0]).project
        rid = created["routers"][r.name] = api.request("POST", "/routers", json={"name": r.name, "project_id": project})["id"]
        for name in r.networks:
            api.request("POST", f"/routers/{rid}/interfaces", json={"subnet_id": created["subnets"][name]})
        if r.mode != "distributed":   # after its interfaces: a mode checks the networks it routes
            api.request("PATCH", f"/routers/{rid}", json={"mode": r.mode})
        if r.external_gateway:
            api.request("PATCH", f"/routers/{rid}", json={
                "external_gateway": {"network_id": created["networks"][r.external_gateway]}})
    progress("creating VM ports")
    for node in topo.nodes:
        for vm in node.vms:
            net = topo.network(vm.network)
            created["ports"][vm.name] = api.request("POST", "/ports", json={
                "network_id": created["networks"][vm.network], "name": vm.name, "mac_address": vm.mac,
                "fixed_ips": [{"subnet_id": created["subnets"][vm.network], "ip_address": str(vm.ip.ip)}],
                "node": node.name, "interface_name": ovs_interface(vm.name, vm.plug), "project_id": net.project})["id"]
            if vm.floating_ip:
                router = next(r for r in topo.routers if vm.network in r.networks and r.external_gateway)
                created["floatingips"][vm.name] = api.request("POST", "/floatingips", json={
                    "floating_network_id": created["networks"][router.external_gateway],
                    "port_id": created["ports"][vm.name], "project_id": net.project})["id"]
    if topo.vnfs():
        progress("creating VNF ports and port pairs")
        created["port_pairs"] = {}
    for node, vnf in topo.vnfs():
        net = topo.network(vnf.network)
        ids = {}
        for side, port in (("i", vnf.ingress), ("o", vnf.egress)):
            # a VNF forwards packets that are not its own: no port security on its ports
            ids[side] = created["ports"][f"{vnf.name}{side}"] = api.request("POST", "/ports", json={
                "network_id": created["networks"][vnf.network], "name": f"{vnf.name}{side}",
                "mac_address": port.mac, "port_security": False,
                "fixed_ips": [{"subnet_id": created["subnets"][vnf.network], "ip_address": str(port.ip.ip)}],
                "node": node.name, "interface_name": ovs_interface(f"{vnf.name}{side}", vnf.plug),
                "project_id": net.project})["id"]
        created["port_pairs"][vnf.name] = api.request("POST", "/sfc/port_pairs", json={
            "name": vnf.name, "ingress": ids["i"], "egress": ids["o"], "project_id": net.project})["id"]
    return created


def wait_active(url: str, created: dict, timeout: float = 30, token: str | None = None) -> None:
    """Until every port the lab created is active (its flows are on the switches).

    An error may be transient (a switch still connecting): only the timeout ends the wait."""
    try:
        _wait_active(Client(url, token=token), created, timeout)
    except ApiError as e:
        raise LabError(f"controller: {e}") from None


def _wait_active(api: Client, created: dict, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for name, pid in sorted(created.get("ports", {}).items()):
        while True:
            try:
                port = api.wait_status("ports", pid, "active", timeout=max(0.1, deadline - time.monotonic()))
            except ApiError as e:
                if e.status != 408:
                    raise
                raise LabError(f"port {name} not active after {timeout}s: {e}") from None
            if port["status"] == "active":
                break
            if time.monotonic() > deadline:
                raise LabError(f"port {name} not active after {timeout}s: {port['status']}: {port['status_reason']}")
            time.sleep(0.2)   # an error (a switch still connecting): the next pass may clear it
    # every switch connected (br-int of each node; with a fabric also each br-phy and the fabric switch),
    # then one full pass, so the underlay is programmed too when `lab up` returns
    fabric = len(created.get("fabric_switches", {}))
    want = len(created.get("nodes", {})) * (2 if fabric else 1) + fabric
    while len(api.request("GET", "/health")["switches"]) < want:
        if time.monotonic() > deadline:
            raise LabError(f"only {len(api.request('GET', '/health')['switches'])} of {want} switches connected "
                           f"after {timeout}s")
        time.sleep(0.2)
    api.request("POST", "/sync")


def issue_agent_token(url: str, node: str, dest: Path, token: str | None = None) -> int:
    """An agent token bound to `node`, written to `dest` (0600) as an operator copies it to the node;
    returns its id (`deregister` revokes it)."""
    api = Client(url, token=token)
    try:
        made = api.request("POST", "/tokens", json={"name": f"agent {node}", "project_id": "admin",
                                                    "roles": ["agent"], "node": node})
        secret = made["token"]
    except ApiError as e:
        raise LabError(f"controller: {e}") from None
    finally:
        api.close()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return made["id"]


def deregister(url: str, created: dict, token: str | None = None) -> None:
    """Best effort: delete what the lab created (the controller may be gone already)."""
    http = Client(url, token=token).http   # raw answers: an object already gone is fine
    try:
        for fid in created.get("floatingips", {}).values():
            http.delete(f"/floatingips/{fid}")
        for pair in created.get("port_pairs", {}).values():
            http.delete(f"/sfc/port_pairs/{pair}")
        for pid in created.get("ports", {}).values():
            http.delete(f"/ports/{pid}")
        for rid in created.get("routers", {}).values():
            http.patch(f"/routers/{rid}", json={"external_gateway": None})
            for iface in http.get(f"/routers/{rid}").json().get("interfaces", []):
                http.delete(f"/routers/{rid}/interfaces/{iface['id']}")
            http.delete(f"/routers/{rid}")
        for nid in created.get("networks", {}).values():
            http.delete(f"/networks/{nid}")
        for sid in created.get("fabric_switches", {}).values():
            http.delete(f"/fabric/switches/{sid}")
        for nid in created.get("nodes", {}).values():
            http.delete(f"/nodes/{nid}")
        for tid in created.get("agent_tokens", {}).values():
            http.delete(f"/tokens/{tid}")
    except httpx.HTTPError:
        pass
