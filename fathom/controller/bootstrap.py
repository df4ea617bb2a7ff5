"""Node bootstrap over OVSDB (ovsdbapp): br-int under our control, the tunnel and uplink ports.

States, in the spirit of ONOS SONA: init → device_created → complete, or error with a reason. Unlike
SONA a node heals itself: every pass re-checks the node's OVSDB and re-applies whatever is missing
(an OVS restart, a deleted port), so no operator action is needed.
"""
from __future__ import annotations

import logging
import socket

from ovsdbapp.backend.ovs_idl import connection, idlutils
from ovsdbapp.schema.open_vswitch import impl_idl

from fathom.controller import channels
from fathom.model import TUNNEL_INTERFACE, UPLINK_INTERFACE, datapath_id

LOG = logging.getLogger("fathom.bootstrap")
OVSDB_PORT = channels.OVSDB_PORT
PHY_PATCH = "patch-int"   # br-phy's end of the patch pair


def local_ip_towards(ip: str) -> str:
    """Our address on the path to ip (a connected UDP socket sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((ip, OVSDB_PORT))
        return s.getsockname()[0]


class NodeOvsdb:
    """One node's OVSDB, reached on ssl:<management ip>:6640 (tcp: when the controller runs --insecure)."""

    def __init__(self, name: str, management_ip: str, timeout: float = 5):
        self.name = name
        self.remote = channels.ovsdb_remote(management_ip)
        helper = idlutils.get_schema_helper(self.remote, "Open_vSwitch")
        for table in ("Open_vSwitch", "Bridge", "Port", "Interface", "Controller"):
            helper.register_table(table)
        conn = connection.Connection(idl=connection.OvsdbIdl(self.remote, helper), timeout=timeout)
        # ovsdbapp keeps its connection on the API class: one subclass per node keeps them apart
        api_cls = type(f"OvsdbIdl_{name}", (impl_idl.OvsdbIdl,), {"_ovsdb_connection": None})
        self.api = api_cls(conn)

    def close(self):
        try:
            self.api.ovsdb_connection.stop()
        except Exception:  # noqa: BLE001 - closing a dead connection
            pass

    def ofports(self, bridge: str = "br-int") -> dict[str, int]:
        """Interface name -> OpenFlow port number, for the interfaces of one bridge."""
        out = {}
        idl = self.api.idl
        for br in idl.tables["Bridge"].rows.values():
            if br.name != bridge:
                continue
            for port in br.ports:
                for iface in port.interfaces:
                    if iface.ofport and iface.ofport[0] > 0:
                        out[iface.name] = iface.ofport[0]
        return out

    def ensure(self, node_id: int, tunnel_ip: str, controller: str, datapath_type: str | None = None) -> bool:
        """Make br-int ours: secure fail mode, our controller, tunnel and uplink ports, and br-int and
        br-phy on `datapath_type` (`system`: the kernel module; `netdev`: userspace; None: leave an
        existing bridge's as it is, create a new one on `netdev`).

        Returns True when something had to change. Reads first, so a healthy node is not written.
        """
        api = self.api
        if not api.idl._session.is_connected():
            # the IDL answers reads from its replica while it reconnects: do not trust it
            raise ConnectionError("not connected to OVSDB")
        dpid = f"{datapath_id(node_id):016x}"
        want_ctrl = [controller]
        changed = False
        br = api.lookup("Bridge", "br-int", default=None) if api.br_exists("br-int").execute() else None
        with api.transaction(check_error=True) as txn:
            if br is None:
                txn.add(api.add_br("br-int", datapath_type=datapath_type or "netdev"))
                changed = True
            for name, row in (("br-int", br), ("br-phy", self._bridge("br-phy"))):
                if row is not None and datapath_type and row.datapath_type != datapath_type:
                    LOG.info("%s %s: datapath_type %s -> %s", self.name, name, row.datapath_type or "(system)",
                             datapath_type)
                    txn.add(api.db_set("Bridge", name, ("datapath_type", datapath_type)))
                    changed = True
            if (br is None or br.fail_mode != ["secure"] or br.other_config.get("datapath-id") != dpid
                    or set(br.protocols) != {"OpenFlow13", "OpenFlow14"}):
                txn.add(api.db_set("Bridge", "br-int", ("fail_mode", "secure"),
                                   ("protocols", ["OpenFlow13", "OpenFlow14"]),
                                   ("other_config", {"datapath-id": dpid, "disable-in-band": "true"})))
                changed = True
            if br is None or sorted(c.target for c in br.controller) != want_ctrl:
                txn.add(api.set_controller("br-int", want_ctrl))
                changed = True
            ports = self.ofports()
            if TUNNEL_INTERFACE not in ports or self._iface_options(TUNNEL_INTERFACE) != {
                    "remote_ip": "flow", "key": "flow", "local_ip": tunnel_ip}:
                txn.add(api.add_port("br-int", TUNNEL_INTERFACE, may_exist=True))
                txn.add(api.db_set("Interface", TUNNEL_INTERFACE, ("type", "vxlan"),
                                   ("options", {"remote_ip": "flow", "key": "flow", "local_ip": tunnel_ip})))
                changed = True
            if UPLINK_INTERFACE not in ports and api.br_exists("br-phy").execute():
                txn.add(api.add_port("br-int", UPLINK_INTERFACE, may_exist=True))
                txn.add(api.db_set("Interface", UPLINK_INTERFACE, ("type", "patch"), ("options", {"peer": PHY_PATCH})))
                txn.add(api.add_port("br-phy", PHY_PATCH, may_exist=True))
                txn.add(api.db_set("Interface", PHY_PATCH, ("type", "patch"), ("options", {"peer": UPLINK_INTERFACE})))
                changed = True
        return changed

    def _bridge(self, name: str):
        return self.api.lookup("Bridge", name, default=None) if self.api.br_exists(name).execute() else None

    def _iface_options(self, name: str) -> dict:
        row = self.api.lookup("Interface", name, default=None)
        return dict(row.options) if row is not None else {}


class Bootstrapper:
    """OVSDB connections to every node, kept and healed across passes."""

    def __init__(self, controller_port: int):
        self.controller_port = controller_port
        self.nodes: dict[str, NodeOvsdb] = {}
        # br-int port numbers last read per node: an OVSDB outage must not look like "no ports"
        self.last_ofports: dict[str, dict[str, int]] = {}

    def run(self, node) -> tuple[str, str | None, dict[str, int]]:
        """One pass for a node: (state, reason, br-int ofports)."""
        if not node.management_ip:
            return "error", "node has no management_ip", {}
        try:
            ovsdb = self.nodes.get(node.name)
            if ovsdb is None or ovsdb.remote != channels.ovsdb_remote(node.management_ip):
                if ovsdb:
                    ovsdb.close()
                ovsdb = self.nodes[node.name] = NodeOvsdb(node.name, node.management_ip)
            controller = channels.controller_target(local_ip_towards(node.management_ip), self.controller_port)
            ovsdb.ensure(node.id, node.tunnel_ip, controller, node.datapath_type)
            self.last_ofports[node.name] = ovsdb.ofports()
            return "complete", None, self.last_ofports[node.name]
        except Exception as e:  # noqa: BLE001 - any failure is the node's state, retried next pass
            LOG.warning("node %s: bootstrap failed: %s", node.name, e)
            stale = self.nodes.pop(node.name, None)
            if stale:
                stale.close()
            return "error", f"OVSDB {node.management_ip}:{OVSDB_PORT}: {e}", self.last_ofports.get(node.name, {})

    def forget(self, name: str) -> None:
        ovsdb = self.nodes.pop(name, None)
        self.last_ofports.pop(name, None)
        if ovsdb:
            ovsdb.close()
