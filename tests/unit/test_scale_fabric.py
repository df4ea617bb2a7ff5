"""`fathom bench scale`'s simulated fabric, checked for correctness (never for speed): a real controller
process, a real ovsdb-server per node, switches speaking OpenFlow 1.4 over TCP (fathom.bench.ofswitch).
Every port reaches `active`, every switch holds exactly the compiled flows (the controller reads each
back over OpenFlow and compares), and a full resync of wiped switches puts every flow back."""
from __future__ import annotations

import os
import shutil

import pytest

from fathom.bench.scale import RUN_ROOT, fabric
from fathom.bench.scale.api import api_rate
from fathom.bench.scale.common import Controller


def test_every_port_active_and_every_switch_in_sync(tmp_path):
    run_dir = RUN_ROOT / f"sk-unit-fabric-{os.getpid()}"   # one per run: others may run it too
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        r = fabric.fabric_run(run_dir, fabric.Size(3, 4), samples=3)
        log = (run_dir / "controller.log").read_text()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    # the simulated nodes' OVSDB is as the bootstrap wants it: it writes nothing (with no
    # ovs-vswitchd to apply a write, its transaction would time out and the node stay pending)
    assert "exceeded timeout" not in log
    assert r["ports"] == 12 and r["networks"] == 1
    assert r["switches_in_sync"] == 3
    assert r["port_up_ms"]["n"] == 3                      # each sample reached active (else it raises)
    assert r["resync_complete"] and r["resync_flows"] > r["flows_total"] > 0
    # the fabric's flows: every switch holds the others' ports too (one network over three nodes)
    assert r["flows_per_switch_max"] >= 12


def test_layout_spreads_networks_over_groups_of_nodes():
    ports = fabric.layout(fabric.Size(20, 10))
    assert len(ports) == 200
    networks = {}
    for node, _, net in ports:
        networks.setdefault(net, set()).add(node // fabric.NETWORK_SPAN)
    assert all(len(groups) == 1 for groups in networks.values())      # a network stays in its group
    assert max(sum(1 for p in ports if p[2] == k) for k in networks) <= fabric.PORTS_PER_NETWORK


def test_the_api_rate_counts_every_port_and_the_cpu_of_each_party(tmp_path, postgres):
    """The API-rate part on a real controller over a real PostgreSQL: every port it counts exists,
    and the CPU per port is split between the controller, the writers and the database server."""
    ctl = Controller(tmp_path / "api", postgres.new_database()).start()
    try:
        r = api_rate(ctl, writers=2, ports=80, store_pid=postgres.pid())
        names = {p["name"] for p in ctl.api.get("/ports")}
    finally:
        ctl.stop()
    assert (r["ports"], r["n_errors"]) == (80, 0)
    assert len(names) == 80
    cpu = r["cpu_ms_per_port"]
    assert set(cpu) == {"controller", "writers", "postgresql"} and all(v > 0 for v in cpu.values()), cpu
    assert r["machine_ceiling_ports_per_second"] == pytest.approx(1000 * os.cpu_count() / sum(cpu.values()))


def test_a_simulated_nodes_ovsdb_sends_an_idle_client_no_echo(tmp_path):
    """A simulated node's ovsdb-server serves TCP from a Manager row with the controller's
    inactivity probe, as a deployed node does: an idle client is sent no echo within ovsdb-server's
    default probe time (5 s), which would otherwise cost every controller at rest an echo a node
    every 5 s."""
    import json
    import socket
    import time

    from fathom.controller import channels
    node = fabric.NodeOvsdb(tmp_path, 0, 1, "10.99.0.1", "tcp:127.0.0.1:6653", 1, fabric.loopback_net(tmp_path))
    try:
        with socket.create_connection((node.ip, 6640), timeout=8) as s:
            s.sendall(json.dumps({"method": "list_dbs", "params": [], "id": 1}).encode())
            got, deadline = b"", time.monotonic() + 6.5
            while time.monotonic() < deadline:
                s.settimeout(max(0.05, deadline - time.monotonic()))
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                got += chunk
        assert b'"Open_vSwitch"' in got                  # the server answered this client
        assert b'"echo"' not in got, got                 # and did not probe it while it was idle
        probe = _ovsdb(node, ["Manager", "inactivity_probe"])
        assert probe == channels.OVSDB_PROBE_MS
    finally:
        node.stop()


def _ovsdb(node, column: list[str]):
    import json
    import subprocess
    table, name = column
    out = subprocess.run(["ovsdb-client", "transact", f"tcp:{node.ip}:6640", json.dumps(
        ["Open_vSwitch", {"op": "select", "table": table, "where": [], "columns": [name]}])],
        capture_output=True, text=True, check=True, timeout=10).stdout
    return json.loads(out)[0]["rows"][0][name]
