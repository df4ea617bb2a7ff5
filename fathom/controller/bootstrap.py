"""Node bootstrap over OVSDB (ovsdbapp): br-int under our control, the tunnel and uplink ports.

States, in the spirit of ONOS SONA: init → device_created → complete, or error with a reason. Unlike
SONA a node heals itself: the node's OVSDB is monitored (ovsdbapp's IDL keeps a replica of the
Bridge, Port, Interface and Controller tables), and every change there that concerns the bridges
(a restarted OVS, a deleted port, another controller target) makes the reconciler re-check the node
and re-apply whatever is missing, so no operator action is needed. Interfaces appearing, leaving or
getting a new OpenFlow port number only refresh the port numbers, kept up to date from the
replica's row notifications (`PortNumbers`: only the rows that changed are read, no round trip).
`on_change(name, what)` tells the reconciler: what = "ports" or "setup".
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import ssl
import threading
import time
from typing import Callable

from fathom.controller import channels
from fathom.controller.extension import NodeBootstrap

channels.import_ovs()   # before ovsdbapp: see there

from ovs import jsonrpc, poller  # noqa: E402
from ovs.stream import Stream  # noqa: E402
from ovsdbapp.backend.ovs_idl import connection, idlutils  # noqa: E402
from ovsdbapp.schema.open_vswitch import commands, impl_idl  # noqa: E402

from fathom.model import TUNNEL_INTERFACE, UPLINK_INTERFACE, datapath_id
from fathom.pipeline.infrastructure import is_infrastructure_interface

LOG = logging.getLogger("fathom.bootstrap")
OVSDB_PORT = channels.OVSDB_PORT
PHY_PATCH = "patch-int"   # br-phy's end of the patch pair
# Seconds a node's check waits for a connection that is starting again (its replica being read
# anew, as after the server dropped an idle-looking client) before it fails: a reconnection
# completes within it unless the server is gone.
REPLICA_WAIT = 2.0


class ReplicaStarting(ConnectionError):
    """The node's OVSDB connection is (re)starting: its replica is not read whole yet. The
    connection reconnects by itself; closing it would only start it over."""


def local_ip_towards(ip: str) -> str:
    """Our address on the path to ip (a connected UDP socket sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((ip, OVSDB_PORT))
        return s.getsockname()[0]


# The columns monitored: what bootstrap reads and writes, and what tells an interface is plugged.
# Counters and state columns (statistics, link_state, is_connected, ...) are left out, so a node
# at rest sends us nothing.
COLUMNS = {
    "Open_vSwitch": None,   # all: ovsdbapp waits on cur_cfg after a write; its changes are ignored below
    "Bridge": ["name", "ports", "controller", "fail_mode", "protocols", "other_config", "datapath_type",
               "external_ids"],
    "Port": ["name", "interfaces", "external_ids"],
    "Interface": ["name", "type", "options", "ofport", "external_ids"],
    "Controller": ["target", "inactivity_probe", "max_backoff"],
}
# How long a switch waits without a word from us before it sends its own echo request (and as long
# again for the reply before it drops the connection and reconnects), in ms: longer than our check
# and our keepalive (fathom.controller.ofapp.ECHO_INTERVAL), so a switch never probes a controller
# that talks to it; shorter than a cluster replica's keepalive of a switch it does not master
# (fathom.controller.ofgate.QUIET_ECHO_INTERVAL), whose probe, answered, keeps that connection.
# OVS's default, 5 s, would add a probe every 5 s to every bridge at rest.
CONTROLLER_PROBE_MS = 30_000
# How long a switch waits at most between two attempts to reach its controller, in ms (OVS's
# minimum; its default, 8 s, doubles from 1 s while the controller is away): a restarted
# controller has every switch back within a second of listening, instead of up to 8 s later,
# and with it the statuses the restart grace holds (fathom.controller.reconciler.STARTUP_GRACE).
# One TCP connection attempt a second per bridge while the controller is down.
CONTROLLER_MAX_BACKOFF_MS = 1_000
OVSDB_PROBE_MS = channels.OVSDB_PROBE_MS   # see there
# Interface columns whose change is a change of the node's ports (plug, unplug, renumbering)
PORT_COLUMNS = frozenset({"name", "ofport", "external_ids"})


class SetController(commands.SetControllerCommand):
    """A bridge's controller targets, each with our inactivity probe (CONTROLLER_PROBE_MS) and
    reconnection backoff (CONTROLLER_MAX_BACKOFF_MS)."""

    def run_idl(self, txn):
        super().run_idl(txn)
        br = idlutils.row_by_value(self.api.idl, "Bridge", "name", self.bridge)
        for controller in br.controller:
            controller.inactivity_probe = CONTROLLER_PROBE_MS
            controller.max_backoff = CONTROLLER_MAX_BACKOFF_MS


def bridge_row(api, name: str):
    """The replica's row of bridge `name`, or None."""
    return api.lookup("Bridge", name, default=None)


def commit(api, commands: list) -> bool:
    """`commands` in one transaction; none: no transaction (no round trip). True if any."""
    if commands:
        with api.transaction(check_error=True) as txn:
            for command in commands:
                txn.add(command)
    return bool(commands)


def controller_differs(br, targets: list[str]) -> bool:
    """Whether a bridge's controllers are not `targets` with our inactivity probe and backoff."""
    return (sorted(c.target for c in br.controller) != sorted(targets)
            or any(list(c.inactivity_probe) != [CONTROLLER_PROBE_MS] or list(c.max_backoff) != [CONTROLLER_MAX_BACKOFF_MS]
                   for c in br.controller))


class PortNumbers:
    """Interface name -> OpenFlow port number of every bridge, kept from the IDL's row notifications:
    each notification reads its one row (a bridge's ports, a port's interfaces, an interface's name
    and number), so asking costs dict lookups, not a walk over every row of the replica. `load`
    reads the whole replica (on a node's bootstrap check, and after a reconnect, when rows may
    have gone without a notification). Written from the IDL's thread, read from the reconciler's."""

    def __init__(self):
        self._lock = threading.Lock()
        self._bridges: dict = {}   # bridge row uuid -> (name, port row uuids)
        self._ports: dict = {}     # port row uuid -> interface row uuids
        self._ifaces: dict = {}    # interface row uuid -> (name, OpenFlow port number or None)
        self._version = 0          # moved by every change of the three above
        self._made: dict[str, tuple[int, dict[str, int]]] = {}   # bridge -> (version, its port numbers)

    @staticmethod
    def _bridge(row) -> tuple:
        return row.name, tuple(p.uuid for p in row.ports)

    @staticmethod
    def _port(row) -> tuple:
        return tuple(i.uuid for i in row.interfaces)

    @staticmethod
    def _iface(row) -> tuple:
        return row.name, row.ofport[0] if row.ofport and row.ofport[0] > 0 else None

    def load(self, tables) -> None:
        """Read every Bridge, Port and Interface row of the replica afresh. Under the lock: a row
        notified meanwhile is read again after this (its notification waits), never overwritten
        with what this read found before the change."""
        with self._lock:
            self._bridges = {u: self._bridge(r) for u, r in list(tables["Bridge"].rows.items())}
            self._ports = {u: self._port(r) for u, r in list(tables["Port"].rows.items())}
            self._ifaces = {u: self._iface(r) for u, r in list(tables["Interface"].rows.items())}
            self._version += 1

    def row(self, table: str, event: str, row, updates=None) -> None:
        """One row notification (ovs.db.idl: event create | update | delete; `updates` the changed
        columns' old values)."""
        read, kept = {"Bridge": (self._bridge, self._bridges), "Port": (self._port, self._ports),
                      "Interface": (self._iface, self._ifaces)}.get(table, (None, None))
        if read is None:
            return
        if event == "update" and updates is not None and not (_ROW_COLUMNS[table] & set(updates._data)):
            return
        value = None if event == "delete" else read(row)
        with self._lock:
            if value is None:
                kept.pop(row.uuid, None)
            else:
                kept[row.uuid] = value
            self._version += 1   # even for the same value: a reconnection's copy may have dropped rows

    def of(self, bridge: str, tables) -> dict[str, int]:
        """The port numbers of `bridge`. Rows no longer in the replica (`tables`) are left out: a
        reconnection's new copy of the database drops rows without a notification."""
        with self._lock:
            made = self._made.get(bridge)
            if made is not None and made[0] == self._version:
                return dict(made[1])
            out = {}
            there = tables["Bridge"].rows, tables["Port"].rows, tables["Interface"].rows
            for uuid, (name, ports) in self._bridges.items():
                if name != bridge or uuid not in there[0]:
                    continue
                for port in ports:
                    for iface in self._ports.get(port, ()) if port in there[1] else ():
                        iface_name, ofport = self._ifaces.get(iface, (None, None))
                        if ofport is not None and iface in there[2]:
                            out[iface_name] = ofport
            self._made[bridge] = (self._version, out)
            return dict(out)


# The columns PortNumbers reads of each table
_ROW_COLUMNS = {"Bridge": frozenset({"name", "ports"}), "Port": frozenset({"interfaces"}),
                "Interface": frozenset({"name", "ofport"})}


class _NotifyingIdl(connection.OvsdbIdl):
    """The IDL replica of one OVSDB server that reports row changes (from ovsdbapp's thread) and
    keeps the bridges' port numbers (`port_numbers`) from them."""

    def __init__(self, remote, helper, on_change):
        super().__init__(remote, helper, probe_interval=OVSDB_PROBE_MS)
        self._on_change = on_change
        self.port_numbers = PortNumbers()
        self.reconnected = True   # until the replica is read whole after the connection (re)started
        self._round: set | None = None   # during a round: what its notifications changed

    def whole(self) -> bool:
        """Connected, and the replica holds the server's answer to this session's monitor request."""
        return self._session.is_connected() and self.state == self.IDL_S_MONITORING

    def run(self):
        """One round of the IDL (ovsdbapp's thread), told as one change at its end (the rows of
        one transaction, e.g. a plugged VIF's Port, Interface and Bridge, wake one pass, not three);
        a lost or regained connection, or a replica read anew, is a change of the node's setup: the
        reconciler marks the node or re-checks it at once."""
        was = self.whole()
        what: set = set()
        self._round = what
        try:
            return super().run()
        finally:   # also after a failed round: what its notifications changed is in the replica
            self._round = None
            if self.whole() != was:
                # a new session's first reply replaces the replica, dropping rows without a notification
                self.reconnected = True
                what.add("setup")
            if what:
                self._tell("setup" if "setup" in what else "ports")

    def _tell(self, what: str) -> None:
        try:
            self._on_change(what)
        except Exception:  # noqa: BLE001 - a listener's failure must not stop the IDL thread
            LOG.exception("OVSDB change listener failed")

    def notify(self, event, row, updates=None):
        table = row._table.name
        if table == "Open_vSwitch":
            return   # cur_cfg/next_cfg move with every transaction; bridges are seen in Bridge rows
        try:
            self.port_numbers.row(table, event, row, updates)
        except Exception:  # noqa: BLE001 - read whole on the next bootstrap check
            LOG.exception("OVSDB %s row %s: port numbers not updated", table, event)
            self.reconnected = True
        if table == "Interface":
            if event == "update" and updates is not None and not (PORT_COLUMNS & set(updates._data)):
                return
            what = "setup" if is_infrastructure_interface(getattr(row, "name", "")) else "ports"
        elif table == "Port":
            if event == "update":
                return   # a port's interfaces come and go with their Interface rows
            what = "setup" if is_infrastructure_interface(getattr(row, "name", "")) else "ports"
        elif table == "Bridge" and event == "update" and updates is not None and set(updates._data) <= {"ports"}:
            what = "ports"   # a port added or removed: an infrastructure port's own row says "setup"
        else:
            what = "setup"
        if self._round is not None:
            self._round.add(what)
        else:
            self._tell(what)


def stream_error(remote: str, err: int) -> str:
    """What an error of an ovs stream means. Streams return errno values, except an ssl: stream's
    TLS handshake, which returns the ssl module's error number: SSL_ERROR_EOF is 8, which
    os.strerror calls "Exec format error". (A TCP connection's errors are all above those numbers.)"""
    if remote.startswith("ssl:") and err in set(ssl.SSLErrorNumber):
        name = ssl.SSLErrorNumber(err).name
        if err in (ssl.SSL_ERROR_EOF, ssl.SSL_ERROR_ZERO_RETURN, ssl.SSL_ERROR_SYSCALL):
            return (f"the node closed the connection in the TLS handshake ({name}): is its OVSDB set up "
                    "for TLS (ovs-vsctl set-ssl, set-manager pssl:) with this controller's CA?")
        return f"TLS handshake failed ({name})"
    return os.strerror(err)


def fetch_schema(remote: str, timeout: float) -> dict:
    """The Open_vSwitch schema from the OVSDB server at `remote`, within `timeout` seconds.

    ovsdbapp's own fetch waits without end for the connection, the TLS handshake and the answer:
    a node whose OVSDB takes the connection and never answers would hold its check for ever, and
    the node would never be checked again."""
    deadline = time.monotonic() + timeout
    err, stream = Stream.open_block(Stream.open(remote), int(timeout * 1000))
    if err:
        raise ConnectionError(f"cannot connect to {remote}: {stream_error(remote, err)}")
    rpc = jsonrpc.Connection(stream)
    try:
        request = jsonrpc.Message.create_request("get_schema", ["Open_vSwitch"])
        err = rpc.send(request)
        while not err:
            err, msg = rpc.recv()
            if err == errno.EAGAIN:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{remote} did not send its schema within {timeout:g} s")
                rpc.run()
                wait = poller.Poller()
                rpc.wait(wait)
                rpc.recv_wait(wait)
                wait.timer_wait(int(left * 1000) + 1)
                wait.block()
                err = 0
            elif not err and msg.id == request.id and msg.type in (jsonrpc.Message.T_REPLY, jsonrpc.Message.T_ERROR):
                if msg.error:
                    raise ConnectionError(f"{remote} refused the schema request: {msg.error}")
                return msg.result
        raise ConnectionError(f"could not retrieve the schema from {remote}: "
                              f"{'connection closed' if err < 0 else stream_error(remote, err)}")
    finally:
        rpc.close()


class NodeOvsdb:
    """One node's OVSDB, reached on ssl:<management ip>:6640 (tcp: when the controller runs --insecure).

    `on_change(name, what)` is called from the IDL's thread on every monitored change ("ports": an
    interface appeared, left or was renumbered; "setup": a bridge, controller or infrastructure port)."""

    def __init__(self, name: str, management_ip: str, timeout: float = 5, on_change=None):
        self.name = name
        self.remote = channels.ovsdb_remote(management_ip)
        helper = idlutils.create_schema_helper(fetch_schema(self.remote, timeout))
        for table, columns in COLUMNS.items():
            if columns is None:
                helper.register_table(table)
            else:
                helper.register_columns(table, columns)
        listener = on_change or (lambda _name, _what: None)
        idl = _NotifyingIdl(self.remote, helper, lambda what: listener(name, what))
        conn = connection.Connection(idl=idl, timeout=timeout)
        # ovsdbapp keeps its connection on the API class: one subclass per node keeps them apart
        api_cls = type(f"OvsdbIdl_{name}", (impl_idl.OvsdbIdl,), {"_ovsdb_connection": None})
        self.api = api_cls(conn)

    def close(self):
        try:
            self.api.ovsdb_connection.stop()
        except Exception:  # noqa: BLE001 - closing a dead connection
            pass

    def ready(self) -> bool:
        """Connected, with the replica read whole since the connection (re)started."""
        return self.api.idl.whole()

    def read(self, what, wait: float = REPLICA_WAIT):
        """`what(api)` over a whole replica that no round of the IDL changes meanwhile (a new
        session's first reply empties the replica and fills it again within one round: a read in
        between would take bridges and ports that are there for gone); waits up to `wait` seconds
        while the connection (re)starts, then raises ReplicaStarting. `what` reads only: a command
        it executed would wait for the IDL's thread, which waits for the replica."""
        deadline = time.monotonic() + wait
        while True:
            with self.api.ovsdb_connection.lock:   # ovsdbapp's thread holds it through each round
                if self.api.idl.whole():
                    return what(self.api)
            if time.monotonic() >= deadline:
                raise ReplicaStarting(f"OVSDB replica not read yet (connection starting, waited {wait:g} s)")
            time.sleep(0.05)

    def ofports(self, bridge: str = "br-int", fresh: bool = False) -> dict[str, int]:
        """Interface name -> OpenFlow port number, for the interfaces of one bridge, as the replica's
        notifications left them (`fresh`, or the first time after a (re)connection: the replica
        read whole)."""
        idl = self.api.idl
        with self.api.ovsdb_connection.lock:
            if fresh or idl.reconnected:
                idl.reconnected = False   # first: a reconnection while reading sets it again
                idl.port_numbers.load(idl.tables)
            return idl.port_numbers.of(bridge, idl.tables)

    def ensure(self, node_id: int, tunnel_ip: str, controller: str | list[str], datapath_type: str | None = None) -> bool:
        """Make br-int ours: secure fail mode, our controller (or every replica's: a list), tunnel and uplink ports, and br-int and
        br-phy on `datapath_type` (`system`: the kernel module; `netdev`: userspace; None: leave an
        existing bridge's as it is, create a new one on `netdev`).

        Returns True when something had to change. Reads first, so a healthy node is not written.
        """
        dpid = f"{datapath_id(node_id):016x}"
        controllers = [controller] if isinstance(controller, str) else sorted(controller)
        # no local_ip: with one, a userspace datapath checks the tunnel's source against the host's
        # local routes, which OVS drops and reads again on every link change of the host (a VM's
        # port plugged or unplugged), and a revalidation in between turns the tunnel flows into
        # drops; without, the source is the route's, from the agent's OVS user route to the tunnel
        # network (fathom.agent.underlay.TunnelRoutes), which stays
        want_tunnel = {"remote_ip": "flow", "key": "flow"}

        def needed(api) -> list:
            """The commands that make the node as we want it, judged from the replica."""
            br, phy = bridge_row(api, "br-int"), bridge_row(api, "br-phy")
            ports = self.ofports()
            out = []
            if br is None:
                out.append(api.add_br("br-int", datapath_type=datapath_type or "netdev"))
            for name, row in (("br-int", br), ("br-phy", phy)):
                if row is not None and datapath_type and row.datapath_type != datapath_type:
                    LOG.info("%s %s: datapath_type %s -> %s", self.name, name, row.datapath_type or "(system)",
                             datapath_type)
                    out.append(api.db_set("Bridge", name, ("datapath_type", datapath_type)))
            if (br is None or br.fail_mode != ["secure"] or br.other_config.get("datapath-id") != dpid
                    or set(br.protocols) != {"OpenFlow13", "OpenFlow14"}):
                out.append(api.db_set("Bridge", "br-int", ("fail_mode", "secure"),
                                      ("protocols", ["OpenFlow13", "OpenFlow14"]),
                                      ("other_config", {"datapath-id": dpid, "disable-in-band": "true"})))
            if br is None or controller_differs(br, controllers):
                out.append(SetController(api, "br-int", controllers))
            if TUNNEL_INTERFACE not in ports or self._iface_options(TUNNEL_INTERFACE) != want_tunnel:
                out += [api.add_port("br-int", TUNNEL_INTERFACE, may_exist=True),
                        api.db_set("Interface", TUNNEL_INTERFACE, ("type", "vxlan"), ("options", want_tunnel))]
            if UPLINK_INTERFACE not in ports and phy is not None:
                out += [api.add_port("br-int", UPLINK_INTERFACE, may_exist=True),
                        api.db_set("Interface", UPLINK_INTERFACE, ("type", "patch"), ("options", {"peer": PHY_PATCH})),
                        api.add_port("br-phy", PHY_PATCH, may_exist=True),
                        api.db_set("Interface", PHY_PATCH, ("type", "patch"), ("options", {"peer": UPLINK_INTERFACE}))]
            return out

        return commit(self.api, self.read(needed))

    def _iface_options(self, name: str) -> dict:
        row = self.api.lookup("Interface", name, default=None)
        return dict(row.options) if row is not None else {}


class Bootstrapper(NodeBootstrap):
    """OVSDB connections to every node, kept and healed across passes.

    `run(node)` checks (and repairs) a node's bridges; `current(node)` answers from the replica
    alone, without a round trip: what a pass uses for a node whose OVSDB reported nothing but
    port changes since it was last checked. `on_change(name, what)` is set by the reconciler."""

    def __init__(self, controller_port: int):
        self.controller_port = controller_port
        self.nodes: dict[str, NodeOvsdb] = {}
        # br-int port numbers last read per node: an OVSDB outage must not look like "no ports"
        self.last_ofports: dict[str, dict[str, int]] = {}
        self.failing: dict[str, str] = {}     # node -> its failure, logged once while it lasts
        self.on_change = lambda name, what: None
        # In a cluster (fathom.controller.cluster): whether this replica may set up a switch (by
        # datapath id: it is its master), and every replica's controller target as seen from a
        # management address. Alone: always, and this controller's target.
        self.may_write: Callable[[int], bool] = lambda dpid: True
        self.targets: Callable[[str], list[str]] = lambda management_ip: [
            channels.controller_target(local_ip_towards(management_ip), self.controller_port)]

    def current(self, node) -> tuple[str, str | None, dict[str, int]] | None:
        """(state, reason, br-int ofports) from the replica, or None when the node must be checked
        with `run` (never checked, its address changed, or its OVSDB connection is down)."""
        ovsdb = self.nodes.get(node.name)
        if (ovsdb is None or not node.management_ip or ovsdb.remote != channels.ovsdb_remote(node.management_ip)
                or not ovsdb.ready()):
            return None
        self.last_ofports[node.name] = ovsdb.ofports()
        return "complete", None, self.last_ofports[node.name]

    def run(self, node) -> tuple[str, str | None, dict[str, int]]:
        """One pass for a node: (state, reason, br-int ofports)."""
        if not node.management_ip:
            return "error", "node has no management_ip", {}
        try:
            ovsdb = self.nodes.get(node.name)
            if ovsdb is None or ovsdb.remote != channels.ovsdb_remote(node.management_ip):
                if ovsdb:
                    ovsdb.close()
                ovsdb = self.nodes[node.name] = NodeOvsdb(node.name, node.management_ip,
                                                          on_change=lambda name, what: self.on_change(name, what))
            if self.may_write(datapath_id(node.id)):
                ovsdb.ensure(node.id, node.tunnel_ip, self.targets(node.management_ip), node.datapath_type)
            self.last_ofports[node.name] = ovsdb.ofports(fresh=True)
            if self.failing.pop(node.name, None) is not None:
                LOG.info("node %s: bootstrap complete again", node.name)
            return "complete", None, self.last_ofports[node.name]
        except Exception as e:  # noqa: BLE001 - any failure is the node's state, retried later
            if self.failing.get(node.name) != str(e):
                LOG.warning("node %s: bootstrap failed: %s (retried, logged again when it changes)", node.name, e)
                self.failing[node.name] = str(e)
            if not isinstance(e, ReplicaStarting):   # a connection that is starting again is kept
                stale = self.nodes.pop(node.name, None)
                if stale:
                    stale.close()
            return "error", f"OVSDB {node.management_ip}:{OVSDB_PORT}: {e}", self.last_ofports.get(node.name, {})

    def forget(self, name: str) -> None:
        ovsdb = self.nodes.pop(name, None)
        self.last_ofports.pop(name, None)
        self.failing.pop(name, None)
        if ovsdb:
            ovsdb.close()
