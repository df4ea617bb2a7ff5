"""A node's OpenFlow port numbers as the controller keeps them (fathom.controller.bootstrap), against
a real ovsdb-server and a dummy-datapath ovs-vswitchd: kept from the replica's row notifications,
they follow every plug, renumbering, rename and unplug, a port moved to another bridge, and a
reconnection that replaces the replica (rows gone without a notification); and they always equal a
fresh read of the whole replica."""
from __future__ import annotations

import random
import subprocess
import threading
import time

import pytest

from fathom.controller import channels
from fathom.controller.bootstrap import REPLICA_WAIT, Bootstrapper, NodeOvsdb, ReplicaStarting, bridge_row
from fathom.controller.fabric import FabricRuntime
from fathom.lab.ovs import wait_for
from fathom.model import Node

from .test_spec_ovs import Ovs


@pytest.fixture
def node(tmp_path):
    """(Ovs, NodeOvsdb of it, ovsdb-server's control socket): the database also on TCP at a
    loopback address of its own, as a node's is on its management address."""
    ip = f"127.{random.randint(64, 250)}.{random.randint(1, 250)}.{random.randint(1, 250)}"
    ovs = Ovs(tmp_path).start()
    ctl = f"{tmp_path}/ovsdb-server.{ovs.procs[0].pid}.ctl"
    ovs.run("ovs-appctl", "-t", ctl, "ovsdb-server/add-remote", f"ptcp:6640:{ip}")
    for br in ("br-int", "br-phy"):
        ovs.vsctl("add-br", br, "--", "set", "bridge", br, "datapath_type=dummy")
    channels.use_plain_tcp()
    node = NodeOvsdb("n1", ip)
    try:
        wait_for(node.ready, 10, "connected", interval=0.02)
        yield ovs, node, ctl
    finally:
        node.close()
        ovs.stop()


LOCAL = 65534   # a bridge's own internal port


def _settles(node: NodeOvsdb, **want: dict) -> None:
    """The kept numbers of each bridge reach `want` (and the bridge's own port, when it has
    others), then equal a read of the whole replica (which the controller does on a bootstrap check:
    only after every bridge was checked, as it would hide a stale kept number)."""
    want = {br.replace("_", "-"): {br.replace("_", "-"): LOCAL, **ports} if ports else {}
            for br, ports in want.items()}
    kept = lambda: {br: node.ofports(br) for br in want}  # noqa: E731
    try:
        wait_for(lambda: kept() == want, 10, f"ports {want}", interval=0.02)
    except AssertionError:
        raise AssertionError(f"kept {kept()}, want {want}") from None
    fresh = {br: node.ofports(br, fresh=True) for br in want}
    assert fresh == want, fresh


def test_port_numbers_follow_every_change_of_the_replica(node):
    ovs, node, _ = node
    _settles(node, br_int={"br-int": LOCAL})
    ovs.vsctl("add-port", "br-int", "vif1", "--", "set", "interface", "vif1", "type=internal", "ofport_request=7")
    ovs.vsctl("add-port", "br-int", "vif2", "--", "set", "interface", "vif2", "type=internal", "ofport_request=8")
    _settles(node, br_int={"vif1": 7, "vif2": 8})
    ovs.vsctl("set", "interface", "vif1", "ofport_request=9")         # renumbered
    _settles(node, br_int={"vif1": 9, "vif2": 8})
    ovs.vsctl("del-port", "br-int", "vif2")                           # unplugged
    _settles(node, br_int={"vif1": 9})
    ovs.vsctl("add-port", "br-phy", "up1", "--", "set", "interface", "up1", "type=internal", "ofport_request=3")
    _settles(node, br_int={"vif1": 9}, br_phy={"up1": 3})          # each bridge apart
    ovs.vsctl("del-port", "br-phy", "up1", "--", "add-port", "br-int", "up1", "--",   # moved between bridges
              "set", "interface", "up1", "type=internal", "ofport_request=3")
    _settles(node, br_int={"vif1": 9, "up1": 3}, br_phy={"br-phy": LOCAL})
    ovs.vsctl("del-br", "br-phy")
    _settles(node, br_phy={})


def test_a_vm_plugged_into_br_int_moves_nothing_on_br_phy(node):
    """What a br-phy's master asks before a node's interfaces wake it (its br-int mastered by
    another replica: fathom.controller.cluster.ClusterMember.concerns): a VM's interface plugged,
    renumbered or unplugged on br-int moves none of br-phy's port numbers; a port on br-phy does."""
    ovs, ovsdb, _ = node
    fabric = FabricRuntime(None, None, 0, lambda: None)
    try:
        assert fabric.phy_moved("n1", ovsdb)             # never compiled
        ovs.vsctl("add-port", "br-phy", "ul0", "--", "set", "interface", "ul0", "type=internal", "ofport_request=2")
        _settles(ovsdb, br_phy={"ul0": 2})
        fabric.phy_ofports["n1"] = ovsdb.ofports("br-phy")    # as a pass compiled it
        assert not fabric.phy_moved("n1", ovsdb)
        ovs.vsctl("add-port", "br-int", "vif1", "--", "set", "interface", "vif1", "type=internal", "ofport_request=7")
        ovs.vsctl("set", "interface", "vif1", "ofport_request=9")
        _settles(ovsdb, br_int={"vif1": 9}, br_phy={"ul0": 2})
        assert not fabric.phy_moved("n1", ovsdb)
        ovs.vsctl("del-port", "br-int", "vif1")
        _settles(ovsdb, br_phy={"ul0": 2})
        assert not fabric.phy_moved("n1", ovsdb)
        ovs.vsctl("set", "interface", "ul0", "ofport_request=3")
        _settles(ovsdb, br_phy={"ul0": 3})
        assert fabric.phy_moved("n1", ovsdb)
    finally:
        fabric.stop()


def test_a_reconnection_that_replaces_the_replica_drops_what_is_gone(node):
    """A change made while the controller is cut off from a restarted ovsdb-server arrives as a
    new copy of the whole database, with no notification for the rows that went: they must not
    linger."""
    ovs, node, ctl = node
    ovs.vsctl("add-port", "br-int", "vif1", "--", "set", "interface", "vif1", "type=internal", "ofport_request=4")
    ovs.vsctl("add-port", "br-int", "vif2", "--", "set", "interface", "vif2", "type=internal", "ofport_request=5")
    ovs.vsctl("add-port", "br-phy", "old", "--", "set", "interface", "old", "type=internal", "ofport_request=2")
    _settles(node, br_int={"vif1": 4, "vif2": 5}, br_phy={"old": 2})
    def meanwhile():
        ovs.vsctl("del-port", "br-int", "vif2", "--", "del-br", "br-phy")   # a new br-phy row, its old one gone
        ovs.vsctl("add-br", "br-phy", "--", "set", "bridge", "br-phy", "datapath_type=dummy", "--",
                  "add-port", "br-phy", "vif3", "--", "set", "interface", "vif3", "type=internal", "ofport_request=6")

    _restart_server(ovs, node, meanwhile)
    wait_for(node.ready, 20, "connected again", interval=0.02)
    # as if the node's bootstrap check had read the replica whole just before the new copy arrived:
    # from here on only the notifications (and the rows still there) tell what is gone
    node.api.idl.reconnected = False
    _settles(node, br_int={"vif1": 4}, br_phy={"vif3": 6})


def _restart_server(ovs, node: NodeOvsdb, meanwhile=lambda: None) -> None:
    """Stop ovsdb-server, start it again on the same database (it keeps no history of transactions,
    so the controller's next session gets a new copy of the whole database), `meanwhile()`, then
    let the controller back in on TCP."""
    _stop_server(ovs, node)
    _start_server(ovs, node, meanwhile)


def _stop_server(ovs, node: NodeOvsdb) -> None:
    server = ovs.procs[0]
    server.terminate()
    server.wait(timeout=10)
    wait_for(lambda: not node.ready(), 10, "disconnected", interval=0.02)


def _start_server(ovs, node: NodeOvsdb, meanwhile=lambda: None) -> None:
    (ovs.base / "db.sock").unlink(missing_ok=True)
    ovs.procs[0] = subprocess.Popen(["ovsdb-server", str(ovs.base / "conf.db"), f"--remote=p{ovs.db}",
                                     f"--log-file={ovs.base}/ovsdb.log"], env=ovs.env)
    wait_for(lambda: (ovs.base / "db.sock").exists(), 10, "ovsdb-server back", interval=0.02)
    meanwhile()
    ctl = f"{ovs.base}/ovsdb-server.{ovs.procs[0].pid}.ctl"
    ovs.run("ovs-appctl", "-t", ctl, "ovsdb-server/add-remote", f"ptcp:6640:{node.remote.split(':')[1]}")


def test_a_read_waits_while_a_new_copy_of_the_replica_arrives(node):
    """A new session's copy of the database empties the replica and fills it again in one round of
    the IDL's thread; a read from another thread (a node's bootstrap check, a pass's port numbers)
    in between would take the node's bridges and ports for gone (and write them again). It waits."""
    ovs, node, _ = node
    ovs.vsctl("add-port", "br-int", "vif1", "--", "set", "interface", "vif1", "type=internal", "ofport_request=4")
    _settles(node, br_int={"vif1": 4})
    idl = node.api.idl
    inside, release = threading.Event(), threading.Event()
    notify = idl.notify

    def held(event, row, updates=None):   # the first row of the new copy: the replica was emptied
        if event == "create" and not release.is_set():
            inside.set()
            release.wait(10)
        return notify(event, row, updates)

    idl.notify = held
    _restart_server(ovs, node)
    assert inside.wait(20), "no new copy of the database arrived"
    got: dict = {}
    readers = [threading.Thread(target=lambda: got.update(ports=node.ofports("br-int"))),
               threading.Thread(target=lambda: got.update(phy=node.read(lambda api: bridge_row(api, "br-phy")).name))]
    for reader in readers:
        reader.start()
    time.sleep(0.5)
    assert all(reader.is_alive() for reader in readers) and not got, got
    release.set()
    for reader in readers:
        reader.join(10)
    assert got == {"ports": {"br-int": LOCAL, "vif1": 4}, "phy": "br-phy"}


def test_a_plugged_vif_is_told_once_per_round_of_the_replica(node):
    """The rows one transaction changes (a VIF's Port and Interface, its bridge's port list) arrive in
    one round of the IDL and are told as one change of the node's ports: plugging a VIF wakes the
    reconciler for its rows, then for its OpenFlow port number (ovs-vswitchd's own transaction)."""
    ovs, node, _ = node
    told: list[str] = []
    node.api.idl._on_change = told.append
    ovs.vsctl("add-port", "br-int", "vif1", "--", "set", "interface", "vif1", "type=internal", "ofport_request=7")
    _settles(node, br_int={"vif1": 7})
    time.sleep(0.3)
    assert told and set(told) == {"ports"} and len(told) <= 2, told


def test_a_read_waits_for_a_reconnection_on_the_same_connection(node):
    """A node's check while its connection starts again (the server dropped it, or restarts) waits
    for the replica instead of failing at once, and fails only once its wait is over; the
    connection is the same one throughout (it reconnects by itself)."""
    ovs, node, _ = node
    conn = node.api.ovsdb_connection
    _stop_server(ovs, node)
    started = time.monotonic()
    with pytest.raises(ReplicaStarting):
        node.read(lambda api: bridge_row(api, "br-int"), wait=0.3)
    assert time.monotonic() - started >= 0.3
    back = threading.Timer(0.3, _start_server, (ovs, node))
    back.start()
    try:
        row = node.read(lambda api: bridge_row(api, "br-int"), wait=30)
    finally:
        back.join()
    assert row.name == "br-int" and node.api.ovsdb_connection is conn


def test_a_check_during_a_reconnection_fails_but_keeps_the_connection(node):
    """The bootstrap check of a node whose connection is starting again reports the error once
    its wait is over, and keeps the connection (closing it would start the reconnection over)."""
    ovs, node, _ = node
    boot = Bootstrapper(controller_port=6653)
    boot.nodes["n1"] = node
    _stop_server(ovs, node)
    state, reason, _ = boot.run(Node(1, "n1", "compute", "198.18.0.1", node.remote.split(":")[1]))
    assert state == "error" and "connection starting" in reason and f"waited {REPLICA_WAIT:g} s" in reason, reason
    assert boot.nodes["n1"] is node
