"""The fabric at run time (issue 7): ToR switches and br-phy under OpenFlow, LLDP link discovery,
router namespaces of network-node routers, and the fabric status endpoints.

Plugged into the reconciler as an extension: at the end of every pass `after_pass` bootstraps the
ToRs (OVSDB: fail_mode secure, our controller, a fixed datapath id) and every node's br-phy (our
controller too, but fail_mode standalone: the underlay keeps working without us), compiles
fathom.pipeline.fabric for them and applies the difference like for br-int (same diff, same atomic
bundles, flows owned by the fabric cookie). A ToR or controller restart therefore converges by the
same diff: flows that are still wanted are never deleted, so no VLAN in use disappears.

LLDP (as ONOS does): every `lldp_interval` seconds the controller sends an LLDP frame out of every
ToR port and out of every node's underlay port `ul0` (packet-out; chassis id = the sender's datapath
id, port id = its port number). The ToR and br-phy punt LLDP to the controller (packet-in); a frame
from br-phy of node N arriving on ToR port P (or the reverse) is the link P <-> N, recorded in the
store (`fabric_links`, source lldp), which then takes precedence over declared wiring.
"""
from __future__ import annotations

import logging
import struct
import threading
import time
from dataclasses import replace

from fastapi import APIRouter, HTTPException

from fathom.controller import switch as sw
from fathom.controller.bootstrap import NodeOvsdb, OVSDB_PORT, local_ip_towards
from fathom.controller.l3agent import L3Agent
from fathom.openflow.spec import SwitchState
from fathom.apps.fabric import compiler as fc
from fathom.model import datapath_id_phy, datapath_id_tor
from fathom.pipeline import stages as st
from fathom.store import fabric as fops
from fathom.store.fabric_models import FabricSwitch

LOG = logging.getLogger("fathom.fabric")
PHY_BRIDGE = "br-phy"
UNDERLAY_PORT = "ul0"
DPID_KIND_MASK = 0xFF00_0000_0000_0000
DPID_ID_MASK = 0x0000_FFFF_FFFF_FFFF


def _owned(cookie, group_id=None) -> bool:
    if group_id is not None:
        return st.parse_group_id(group_id)[0] == st.APP_FABRIC
    return st.parse_cookie(cookie)[0] == st.APP_FABRIC


def ensure_bridge(ovsdb: NodeOvsdb, bridge: str, dpid: int, controller: str, fail_mode: str) -> bool:
    """Our controller, fail mode and datapath id on an existing bridge; True if anything changed."""
    api = ovsdb.api
    br = api.lookup("Bridge", bridge, default=None) if api.br_exists(bridge).execute() else None
    if br is None:
        raise RuntimeError(f"bridge {bridge} does not exist")
    changed = False
    want = f"{dpid:016x}"
    with api.transaction(check_error=True) as txn:
        if (br.fail_mode != [fail_mode] or br.other_config.get("datapath-id") != want
                or set(br.protocols) != {"OpenFlow13", "OpenFlow14"}):
            other = dict(br.other_config)
            other.update({"datapath-id": want, "disable-in-band": "true"})
            txn.add(api.db_set("Bridge", bridge, ("fail_mode", fail_mode),
                               ("protocols", ["OpenFlow13", "OpenFlow14"]), ("other_config", other)))
            changed = True
        if sorted(c.target for c in br.controller) != [controller]:
            txn.add(api.set_controller(bridge, [controller]))
            changed = True
    return changed


LLDP_SRC_MAC = "02:fb:00:00:00:01"
CHASSIS_PREFIX = b"fathom:"


def lldp_probe(dpid: int, port_no: int) -> bytes:
    """An LLDP frame naming its sender: chassis id `fathom:<dpid hex>`, port id = the port number."""
    from os_ken.lib.packet import ethernet, lldp, packet
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(lldp.LLDP_MAC_NEAREST_BRIDGE, LLDP_SRC_MAC, 0x88CC))
    pkt.add_protocol(lldp.lldp((
        lldp.ChassisID(subtype=lldp.ChassisID.SUB_LOCALLY_ASSIGNED, chassis_id=CHASSIS_PREFIX + b"%016x" % dpid),
        lldp.PortID(subtype=lldp.PortID.SUB_PORT_COMPONENT, port_id=struct.pack("!I", port_no)),
        lldp.TTL(ttl=120), lldp.End())))
    pkt.serialize()
    return bytes(pkt.data)


def lldp_parse(data: bytes) -> tuple[int, int] | None:
    """(sender dpid, sender port) of one of our probes, None for any other frame."""
    from os_ken.lib.packet import lldp, packet
    try:
        probe = packet.Packet(data).get_protocol(lldp.lldp)
        chassis, port = probe.tlvs[0], probe.tlvs[1]
        if not chassis.chassis_id.startswith(CHASSIS_PREFIX) or len(port.port_id) != 4:
            return None
        return int(chassis.chassis_id[len(CHASSIS_PREFIX):], 16), struct.unpack("!I", port.port_id)[0]
    except Exception:  # noqa: BLE001 - not an LLDP frame we can read
        return None


class FabricRuntime:
    def __init__(self, app, session_factory, of_port: int, wake, lldp_interval: float = 3.0):
        self.app = app
        self.Session = session_factory
        self.of_port = of_port
        self.wake = wake
        self.lldp_interval = lldp_interval
        self.tors: dict[str, NodeOvsdb] = {}
        self.tor_ports: dict[int, dict[str, int]] = {}    # switch id -> {port name: ofport}
        self.phy_ports: dict[int, int] = {}               # node id -> ofport of ul0 on br-phy
        self.agent = L3Agent()
        self._tor_ofports: dict[str, dict[str, int]] = {}
        self._switch_status = None
        self.last: dict = {"switches": {}, "desired": {}, "routers": {}}
        self._lldp_seen: dict[tuple[int, str, int], float] = {}
        self._stop = threading.Event()
        self.lldp_sent = 0
        self.lldp_received = 0

    # ------------------------------------------------------------------------------- wiring

    def install(self, reconciler, api) -> None:
        """Hook into a reconciler and the API app: one call from fathom.controller.server."""
        reconciler.extensions.append(self)
        previous = self.app.on_packet_in

        def on_packet_in(msg):
            if not self.on_packet_in(msg):
                previous(msg)
        self.app.on_packet_in = on_packet_in
        self.reconciler = reconciler
        api.include_router(self.router())
        threading.Thread(target=self._lldp_loop, daemon=True, name="lldp").start()

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------------------- passes

    def before_apply(self, rec, snapshot, result) -> None:
        """Phase 1, before the br-ints change: the ToRs get what is new (flow puts, new groups) but
        lose nothing yet, so a path the nodes are about to use exists when they use it."""
        fab = fc.fabric_state(snapshot)
        self._switch_status = self._bootstrap_tors(fab)
        result.status_overrides.update(self._router_status(fab, snapshot, self._switch_status))
        snapshot = replace(snapshot, fabric=fab.with_ofports(self._tor_ofports))
        for s in fab.switches:
            dp = self.app.datapath(datapath_id_tor(s.id))
            if dp is None:
                continue
            try:
                self.apply(dp, fc.compile_tor(snapshot)[s.name], additions_only=True)
            except Exception as e:  # noqa: BLE001 - phase 2 retries and reports
                LOG.warning("fabric switch %s: phase 1 failed: %s", s.name, e)

    def _bootstrap_tors(self, fab) -> dict[int, tuple[str, str | None]]:
        controller_for = lambda ip: f"tcp:{local_ip_towards(ip)}:{self.of_port}"  # noqa: E731
        switch_status: dict[int, tuple[str, str | None]] = {}
        ofports = {}
        for s in fab.switches:
            try:
                ovsdb = self.tors.get(s.name)
                if ovsdb is None or ovsdb.remote != f"tcp:{s.management_ip}:{OVSDB_PORT}":
                    if ovsdb:
                        ovsdb.close()
                    ovsdb = self.tors[s.name] = NodeOvsdb(f"tor_{s.name}", s.management_ip)
                ensure_bridge(ovsdb, s.bridge, datapath_id_tor(s.id), controller_for(s.management_ip), "secure")
                ofports[s.name] = {n: p for n, p in ovsdb.ofports(s.bridge).items() if n != s.bridge}
                self.tor_ports[s.id] = ofports[s.name]
            except Exception as e:  # noqa: BLE001 - the switch's status, retried next pass
                LOG.warning("fabric switch %s: %s", s.name, e)
                stale = self.tors.pop(s.name, None)
                if stale:
                    stale.close()
                switch_status[s.id] = ("error", f"OVSDB {s.management_ip}:{OVSDB_PORT}: {e}")
        for gone in set(self.tors) - {s.name for s in fab.switches}:
            self.tors.pop(gone).close()
        self._tor_ofports = ofports
        return switch_status

    def after_pass(self, rec, snapshot, result) -> None:
        """Phase 2: br-phy, the full ToR diff (removals too), network-node routers, status."""
        fab = fc.fabric_state(snapshot)
        controller_for = lambda ip: f"tcp:{local_ip_towards(ip)}:{self.of_port}"  # noqa: E731
        switch_status = getattr(self, "_switch_status", None)
        if switch_status is None:
            switch_status = self._bootstrap_tors(fab)
        self._switch_status = None
        snapshot = replace(snapshot, fabric=fab.with_ofports(self._tor_ofports))

        # br-phy of every node: our controller (standalone), LLDP punt
        for node in snapshot.nodes:
            ovsdb = rec.bootstrapper.nodes.get(node.name)
            if ovsdb is None or not fab.switches:
                continue
            try:
                ensure_bridge(ovsdb, PHY_BRIDGE, datapath_id_phy(node.id), controller_for(node.management_ip),
                              "standalone")
                port = ovsdb.ofports(PHY_BRIDGE).get(UNDERLAY_PORT)
                if port:
                    self.phy_ports[node.id] = port
            except Exception as e:  # noqa: BLE001
                LOG.warning("node %s br-phy: %s", node.name, e)

        desired = {("tor", s.name): st_ for s in fab.switches for st_ in [fc.compile_tor(snapshot)[s.name]]} \
            if fab.switches else {}
        if fab.switches:
            for name, state in fc.compile_phy(snapshot).items():
                desired[("phy", name)] = state
        ids = {("tor", s.name): datapath_id_tor(s.id) for s in fab.switches}
        ids.update({("phy", n.name): datapath_id_phy(n.id) for n in snapshot.nodes})
        for key, state in desired.items():
            dp = self.app.datapath(ids[key])
            if dp is None:
                if key[0] == "tor":
                    s = next(x for x in fab.switches if x.name == key[1])
                    switch_status.setdefault(s.id, ("pending", "waiting for the switch to connect over OpenFlow"))
                continue
            try:
                self.apply(dp, state)
                if key[0] == "tor":
                    s = next(x for x in fab.switches if x.name == key[1])
                    switch_status.setdefault(s.id, ("active", None))
            except Exception as e:  # noqa: BLE001
                LOG.warning("%s %s: apply failed: %s", *key, e)
                if key[0] == "tor":
                    s = next(x for x in fab.switches if x.name == key[1])
                    switch_status[s.id] = ("error", f"apply failed: {e}")

        # network-node routers: their namespaces on the gateway nodes
        want = fc.network_node_legs(snapshot)
        subnets = {x.id: x for x in snapshot.subnets}
        router_result = self.agent.sync({n.name: n.management_ip for n in snapshot.nodes}, want, subnets,
                                        lambda node: rec.bootstrapper.nodes.get(node))
        if self.agent.created:
            # new legs' br-int ports: the next pass compiles them with their port numbers
            self.agent.created = False
            self.wake()
        self.last = {"desired": desired, "snapshot": snapshot, "routers": router_result,
                     "switches": switch_status}
        self._write_status(switch_status, router_result, snapshot)

    def apply(self, dp, desired: SwitchState, additions_only: bool = False) -> int:
        actual_flows = sw.read_flows(self.app, dp)
        actual_groups = sw.read_groups(self.app, dp)
        change = sw.diff(set(desired.flows), set(desired.groups), actual_flows, actual_groups, _owned)
        if additions_only:   # (puts, deletes, group adds, group mods, group deletes)
            change = (change[0], [], change[2], [], [])
        n = sum(len(c) for c in change)
        if n:
            LOG.info("fabric switch %016x: %d flow puts, %d flow deletes, %d/%d/%d group add/mod/del",
                     dp.id, *map(len, change))
            sw.apply(self.app, dp, sw.messages(dp, *change))
        return n

    def _router_status(self, fab, snapshot, switch_status) -> dict:
        """(KIND_ROUTER, id) -> (status, reason) of every router not in distributed mode."""
        effective = fc.effective_modes(snapshot)
        routers_result = self.last.get("routers") or {}
        out = {}
        for md in fab.modes:
            if md.mode == "network-node":
                r = routers_result.get(md.router_id)
                if r not in ("ok", None):
                    status, reason = "error", r
                elif md.router_id not in effective:
                    status, reason = "pending", "building the router namespace on the gateway node"
                else:
                    status, reason = "active", None
            elif md.mode == "fabric":
                connected = [s for s in fab.switches if self.app.datapath(datapath_id_tor(s.id)) is not None
                             and switch_status.get(s.id, ("active",))[0] != "error"]
                status, reason = ("active", None) if connected else ("pending", "no fabric switch connected")
            else:
                continue
            out[(st.KIND_ROUTER, md.router_id)] = (status, reason)
        return out

    def _write_status(self, switch_status, router_result, snapshot) -> None:
        with self.Session() as session, session.begin():
            for sid, (status, reason) in switch_status.items():
                row = session.get(FabricSwitch, sid)
                if row is not None and (row.status, row.status_reason) != (status, reason):
                    row.status, row.status_reason = status, reason

    # ------------------------------------------------------------------------------- LLDP

    def _lldp_loop(self) -> None:
        while not self._stop.wait(self.lldp_interval):
            try:
                self.send_lldp()
            except Exception:  # noqa: BLE001
                LOG.exception("LLDP probe failed")

    def send_lldp(self) -> int:
        sent = 0
        probes = []
        for sid, ports in list(self.tor_ports.items()):
            dpid = datapath_id_tor(sid)
            probes += [(dpid, p) for p in ports.values() if 0 < p < 0xFFFFFF00]
        for nid, port in list(self.phy_ports.items()):
            probes.append((datapath_id_phy(nid), port))
        for dpid, port in probes:
            dp = self.app.datapath(dpid)
            if dp is None:
                continue
            ofp, parser = dp.ofproto, dp.ofproto_parser
            data = lldp_probe(dpid, port)
            dp.send_msg(parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                                            actions=[parser.OFPActionOutput(port, 0)], data=data))
            sent += 1
        self.lldp_sent += sent
        return sent

    def on_packet_in(self, msg) -> bool:
        """True if the packet was an LLDP probe of ours (consumed)."""
        data = bytes(msg.data)
        if len(data) < 14 or data[12:14] != b"\x88\xcc":
            return False
        parsed = lldp_parse(data)
        if parsed is None:  # someone else's LLDP
            return True
        src_dpid, src_port = parsed
        rx_dpid, rx_port = msg.datapath.id, msg.match["in_port"]
        tor = 0xFB00_0000_0000_0000
        phy = 0xFC00_0000_0000_0000
        if rx_dpid & DPID_KIND_MASK == tor and src_dpid & DPID_KIND_MASK == phy:
            sid, ofport, node_id = rx_dpid & DPID_ID_MASK, rx_port, src_dpid & DPID_ID_MASK
        elif rx_dpid & DPID_KIND_MASK == phy and src_dpid & DPID_KIND_MASK == tor:
            sid, ofport, node_id = src_dpid & DPID_ID_MASK, src_port, rx_dpid & DPID_ID_MASK
        else:
            return True
        self.lldp_received += 1
        name = next((n for n, p in self.tor_ports.get(sid, {}).items() if p == ofport), None)
        if name is None:
            return True
        key = (sid, name, node_id)
        now = time.monotonic()
        if now - self._lldp_seen.get(key, 0) < 30:   # known and recently written
            return True
        with self.Session() as session, session.begin():
            news = fops.record_lldp_link(session, sid, name, ofport, node_id)
        self._lldp_seen = {k: v for k, v in self._lldp_seen.items() if k[:2] != key[:2] and k[2] != node_id}
        self._lldp_seen[key] = now
        if news:
            LOG.info("LLDP: fabric switch %d port %s (%d) faces node %d", sid, name, ofport, node_id)
            self.wake()
        return True

    # ------------------------------------------------------------------------------- status API

    def status(self, switch_id: int) -> dict:
        snapshot = self.last.get("snapshot")
        with self.Session() as session:
            row = session.get(FabricSwitch, switch_id)
            if row is None:
                raise HTTPException(404, detail=[{"loc": ["path", "switch_id"],
                                                  "msg": f"fabric switch {switch_id} does not exist"}])
            name, status, reason = row.name, row.status, row.status_reason
        dp = self.app.datapath(datapath_id_tor(switch_id))
        desired = fc.tor_vlans(snapshot).get(name, {}) if snapshot is not None else {}
        ports = self.tor_ports.get(switch_id, {})
        actual: dict[str, set[int]] | None = None
        in_sync = None
        if dp is not None:
            flows = sw.read_flows(self.app, dp)
            by_no = {p: n for n, p in ports.items()}
            actual = {n: set() for n in ports}
            for f in flows:
                md = f.match_dict
                if f.table == fc.TOR_TRUNK_IN and f.priority == fc.PRIO_ALLOW and "in_port" in md:
                    actual.setdefault(by_no.get(md["in_port"], str(md["in_port"])), set()).add(md["vlan_vid"] & 0xFFF)
            want = self.last.get("desired", {}).get(("tor", name))
            in_sync = want is not None and {f for f in flows if _owned(f.cookie)} == set(want.flows)
        fab = fc.fabric_state(snapshot) if snapshot is not None else None
        faces = {}
        if fab is not None:
            s = next((x for x in fab.switches if x.id == switch_id), None)
            if s is not None:
                faces = {port: node for node, (port, _) in fab.node_ports(s).items()}
        sources = {}
        if snapshot is not None and fab is not None:
            for link in fab.links:
                if link.switch_id == switch_id and faces.get(link.port_name) == link.node:
                    sources.setdefault(link.port_name, set()).add(link.source)
        out_ports = []
        for pname in sorted(set(ports) | set(desired)):
            out_ports.append({"port": pname, "ofport": ports.get(pname), "node": faces.get(pname),
                              "link": sorted(sources.get(pname, ())),
                              "vlans_desired": sorted(desired.get(pname, ())),
                              "vlans": sorted(actual.get(pname, ())) if actual is not None else None})
        return {"id": switch_id, "name": name, "status": status, "status_reason": reason,
                "connected": dp is not None, "in_sync": in_sync, "ports": out_ports,
                "lldp": {"sent": self.lldp_sent, "received": self.lldp_received}}

    def router(self) -> APIRouter:
        r = APIRouter(prefix="/v1", tags=["fabric"])

        @r.get("/fabric/switches/{switch_id}/status",
               summary="A ToR's ports: the node behind each (LLDP / declared) and its VLAN set, desired and actual")
        def switch_status(switch_id: int):
            return self.status(switch_id)

        @r.get("/fabric/switches/{switch_id}/flows", summary="Desired ToR flows (ovs-ofctl syntax)")
        def switch_flows(switch_id: int):
            with self.Session() as session:
                row = session.get(FabricSwitch, switch_id)
            if row is None:
                raise HTTPException(404, detail=[{"loc": ["path", "switch_id"], "msg": "no such switch"}])
            want = self.last.get("desired", {}).get(("tor", row.name))
            return {"desired": want.to_ofctl() if want else []}

        return r
