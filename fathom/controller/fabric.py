"""The fabric at run time: fabric switches and br-phy under OpenFlow, LLDP link discovery,
and the fabric status endpoints.

Plugged into the reconciler as an extension that never writes flows itself: `prepare` bootstraps
the fabric switches and every node's br-phy (OVSDB: fail_mode secure, our controller, a fixed datapath id) and
adds their port numbers to the model; the fabric app (fathom/apps/fabric) compiles their flows and
the reconciler applies them like every other switch's, by diff: flows that are still wanted are
never deleted, so a fabric switch or controller restart makes no VLAN in use disappear. (Router namespaces of
network-node routers are the gateway node's agent's work: fathom.controller.hostlocal.) fail_mode secure, not standalone, on br-phy too: a standalone bridge that
has lost its controller for 3 inactivity probes "fails open" (OVS flushes its table and switches
NORMAL), and when the controller is back OVS removes that NORMAL flow before we have re-added ours,
which blacks out the underlay; a secure bridge keeps our flows, however long we are gone. A switch
whose OVSDB could not be read this pass is left as it is: compiled without its port numbers, its
desired state would miss flows that are still wanted.

LLDP (as ONOS does): the controller sends a signed LLDP frame out of every node's underlay port
`ul0` (packet-out; chassis id = the sender's datapath id, port id = its port number, an HMAC with a
per-process key). The fabric switch punts LLDP to the controller (packet-in); a valid probe from br-phy of
node N arriving on fabric switch port P is the link P <-> N, recorded in the store (`fabric_links`, source
lldp), which then takes precedence over declared wiring. LLDP punted by any other switch (br-phy,
where tenant VLAN traffic arrives too) teaches nothing. Probes go out LLDP_SETTLE seconds after
an event that may change the wiring (a fabric switch or br-phy connected, reported a port-status, as a moved
cable does on both its ports, or was sent flows; a node's underlay port is new), and every
`lldp_interval` seconds (LLDP's own transmit interval, 30 s) for what no event tells. A known
link's `last_seen` is written again at most every LLDP_REFRESH seconds.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import struct
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace

from fathom.api.runtime import fabric_runtime_router
from fathom.apps import BR_INT, BR_PHY, FABRIC_SWITCH, SwitchKey
from fathom.apps.fabric import compiler as fc
from fathom.controller import channels
from fathom.controller import switch as sw
from fathom.controller.bootstrap import (NodeOvsdb, OVSDB_PORT, SetController, bridge_row, commit, controller_differs,
                                        local_ip_towards)
from fathom.controller.extension import Extension
from fathom.controller.results import SwitchResult
from fathom.controller.setups import SETUP_WAIT
from fathom.model import datapath_id, datapath_id_phy, datapath_id_fabric, routers
from fathom.pipeline.cookies import owns_cookie
from fathom.store import fabric as fops
from fathom.store.errors import NotFound
from fathom.store.fabric_models import FabricSwitch
from fathom.store.ops import valid_id

LOG = logging.getLogger("fathom.fabric")
PHY_BRIDGE = "br-phy"
UNDERLAY_PORT = fc.PHY_UNDERLAY
DPID_KIND_MASK = 0xFF00_0000_0000_0000
DPID_ID_MASK = 0x0000_FFFF_FFFF_FFFF
DPID_FABRIC, DPID_PHY = datapath_id_fabric(0), datapath_id_phy(0)   # the kind byte of a fabric switch's, a br-phy's


def ensure_bridge(ovsdb: NodeOvsdb, bridge: str, dpid: int, controllers: list[str], fail_mode: str) -> bool:
    """Our controllers (every replica's in a cluster), fail mode and datapath id on an existing bridge; True if anything changed."""
    want = f"{dpid:016x}"

    def needed(api) -> list:
        br = bridge_row(api, bridge)
        if br is None:
            raise RuntimeError(f"bridge {bridge} does not exist")
        out = []
        if (br.fail_mode != [fail_mode] or br.other_config.get("datapath-id") != want
                or set(br.protocols) != {"OpenFlow13", "OpenFlow14"}):
            other = dict(br.other_config)
            other.update({"datapath-id": want, "disable-in-band": "true"})
            out.append(api.db_set("Bridge", bridge, ("fail_mode", fail_mode),
                                  ("protocols", ["OpenFlow13", "OpenFlow14"]), ("other_config", other)))
        if controller_differs(br, controllers):
            out.append(SetController(api, bridge, controllers))
        return out

    return commit(ovsdb.api, ovsdb.read(needed))


LLDP_INTERVAL = 30.0   # seconds between probes with no event (IEEE 802.1AB's default transmit interval)
LLDP_SETTLE = 0.5      # seconds from a wiring event to its probes (several events, one round)
LLDP_REFRESH = 300.0   # a known link's last_seen is written at most this often
LLDP_SRC_MAC = "02:fb:00:00:00:01"
CHASSIS_PREFIX = b"fathom:"
# the probe's signature: an organizationally specific TLV (locally administered OUI) holding the
# send time and an HMAC over sender, port and time with a key only this controller process knows
SIGNATURE_OUI, SIGNATURE_SUBTYPE = b"\x02\xfb\x00", 1
PROBE_MAX_AGE = 30.0


def _signature(key: bytes, dpid: int, port_no: int, sent: int) -> bytes:
    return hmac.new(key, struct.pack("!QIQ", dpid, port_no, sent), hashlib.sha256).digest()[:16]


def lldp_probe(dpid: int, port_no: int, key: bytes | None = None) -> bytes:
    """An LLDP frame naming its sender: chassis id `fathom:<dpid hex>`, port id = the port number;
    signed with `key` when given."""
    from os_ken.lib.packet import ethernet, lldp, packet
    tlvs = [lldp.ChassisID(subtype=lldp.ChassisID.SUB_LOCALLY_ASSIGNED, chassis_id=CHASSIS_PREFIX + b"%016x" % dpid),
            lldp.PortID(subtype=lldp.PortID.SUB_PORT_COMPONENT, port_id=struct.pack("!I", port_no)),
            lldp.TTL(ttl=120)]
    if key is not None:
        sent = int(time.time() * 1000)
        tlvs.append(lldp.OrganizationallySpecific(oui=SIGNATURE_OUI, subtype=SIGNATURE_SUBTYPE,
                                                  info=struct.pack("!Q", sent) + _signature(key, dpid, port_no, sent)))
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(lldp.LLDP_MAC_NEAREST_BRIDGE, LLDP_SRC_MAC, 0x88CC))
    pkt.add_protocol(lldp.lldp((*tlvs, lldp.End())))
    pkt.serialize()
    return bytes(pkt.data)


def lldp_parse(data: bytes, key: bytes | None = None) -> tuple[int, int] | None:
    """(sender dpid, sender port) of one of our probes, None for any other frame. With `key`, only
    a probe signed with it and sent less than PROBE_MAX_AGE seconds ago counts."""
    from os_ken.lib.packet import lldp, packet
    try:
        probe = packet.Packet(data).get_protocol(lldp.lldp)
        chassis, port = probe.tlvs[0], probe.tlvs[1]
        if not chassis.chassis_id.startswith(CHASSIS_PREFIX) or len(port.port_id) != 4:
            return None
        dpid, port_no = int(chassis.chassis_id[len(CHASSIS_PREFIX):], 16), struct.unpack("!I", port.port_id)[0]
        if key is not None:
            sig = next((t for t in probe.tlvs if isinstance(t, lldp.OrganizationallySpecific)
                        and t.oui == SIGNATURE_OUI and t.subtype == SIGNATURE_SUBTYPE), None)
            if sig is None or len(sig.info) != 24:
                return None
            sent = struct.unpack("!Q", sig.info[:8])[0]
            if (not hmac.compare_digest(sig.info[8:], _signature(key, dpid, port_no, sent))
                    or abs(time.time() * 1000 - sent) > PROBE_MAX_AGE * 1000):
                return None
        return dpid, port_no
    except Exception:  # noqa: BLE001 - not an LLDP frame we can read
        return None


class FabricRuntime(Extension):
    def __init__(self, app, session_factory, of_port: int, wake, lldp_interval: float = LLDP_INTERVAL,
                 lldp_key: bytes | None = None):
        self.app = app
        self.Session = session_factory
        self.of_port = of_port
        self.wake = wake
        self.reconciler = None     # install()
        self.lldp_interval = lldp_interval
        self.switch_ovsdb: dict[str, NodeOvsdb] = {}
        # fabric switch OVSDB connections being made: name -> (remote, its future)
        self._connecting: dict[str, tuple[str, Future]] = {}
        self._connect_pool = ThreadPoolExecutor(4, thread_name_prefix="fabric-connect")
        # links learnt from LLDP are written to the store here, not on the OpenFlow app's event
        # thread: a write waiting for PostgreSQL would hold every switch's events behind it (bundle
        # commit replies, role statuses, connections)
        self._links = ThreadPoolExecutor(1, thread_name_prefix="lldp-links")
        self.fabric_ports: dict[int, dict[str, int]] = {}    # switch id -> {port name: ofport}
        self.phy_ports: dict[int, int] = {}               # node id -> ofport of ul0 on br-phy
        self.phy_ofports: dict[str, dict[str, int]] = {}  # node name -> {br-phy interface: ofport}
        self.last: dict = {}
        self._lldp_seen: dict[tuple[int, str, int], float] = {}
        # signs our probes: a forged or replayed frame does not verify. A cluster's replicas share theirs
        # (fathom.cluster.leases.shared_key): a br-phy's master sends the probe, the fabric switch's verifies it
        self._lldp_key = lldp_key or os.urandom(32)
        self._stop = threading.Event()
        self._probe_soon = threading.Event()   # the wiring may have changed: probe after LLDP_SETTLE
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
        switch_was, port_status_was = self.app.on_switch, self.app.on_port_status

        def on_switch(dpid, datapath):
            switch_was(dpid, datapath)
            if datapath is not None:
                self.wiring_event(dpid)

        def on_port_status(dpid):
            port_status_was(dpid)
            self.wiring_event(dpid)
        self.app.on_switch, self.app.on_port_status = on_switch, on_port_status
        self.reconciler = reconciler
        api.include_router(fabric_runtime_router(self.status, self.desired_flows))
        threading.Thread(target=self._lldp_loop, daemon=True, name="lldp").start()

    def stop(self) -> None:
        self._stop.set()
        self._probe_soon.set()
        self._connect_pool.shutdown(wait=False, cancel_futures=True)
        self._links.shutdown(wait=False, cancel_futures=True)

    def wiring_event(self, dpid: int) -> None:
        """A switch connected or reported a port-status: a fabric switch's or br-phy's makes the next probes
        go out within LLDP_SETTLE (a br-int's says nothing of the underlay's wiring)."""
        if dpid & DPID_KIND_MASK in (DPID_FABRIC, DPID_PHY):
            self._probe_soon.set()

    # ------------------------------------------------------------------------------- passes

    def prepare(self, rec, snapshot, result):
        """Before compiling: the fabric switches and every node's br-phy under our controller (OVSDB), their
        setup recorded as switch results; returns the model with their port numbers."""
        fab = routers.fabric_state(snapshot)
        # the controller targets, and whether this replica sets a switch up (in a cluster: every
        # replica's targets, set by the switch's master: fathom.controller.cluster)
        if rec.cluster is not None:
            controller_for, may_write = rec.cluster.targets, rec.cluster.sets_up
        else:
            controller_for = lambda ip: [channels.controller_target(local_ip_towards(ip), self.of_port)]  # noqa: E731
            may_write = lambda dpid: True  # noqa: E731
        ofports = {}
        for s in fab.switches:
            key = SwitchKey(FABRIC_SWITCH, s.name)
            res = result.switches[key] = SwitchResult(key, datapath_id_fabric(s.id))
            try:
                ovsdb = self.switch_ovsdb.get(s.name)
                fresh = ovsdb is None or ovsdb.remote != channels.ovsdb_remote(s.management_ip) or not ovsdb.ready()
                if fresh:
                    if ovsdb:
                        self.switch_ovsdb.pop(s.name).close()
                    ovsdb = self.switch_ovsdb[s.name] = self._connect(rec, s)
                # the bridge is re-checked when its OVSDB reported a change (or is new, or failed)
                if (fresh or rec.setup_due(s.name)) and may_write(datapath_id_fabric(s.id)):
                    ensure_bridge(ovsdb, s.bridge, datapath_id_fabric(s.id), controller_for(s.management_ip), "secure")
                ofports[s.name] = {n: p for n, p in ovsdb.ofports(s.bridge).items() if n != s.bridge}
                self.fabric_ports[s.id] = ofports[s.name]
            except Exception as e:  # noqa: BLE001 - the switch's status, retried next pass
                LOG.warning("fabric switch %s: %s", s.name, e)
                stale = self.switch_ovsdb.pop(s.name, None)
                if stale:
                    stale.close()
                res.setup, res.reason = "error", f"OVSDB {s.management_ip}:{OVSDB_PORT}: {e}"
        for gone in set(self.switch_ovsdb) - {s.name for s in fab.switches}:
            self.switch_ovsdb.pop(gone).close()
        for gone in set(self._connecting) - {s.name for s in fab.switches}:
            self._forget_connecting(gone)

        # br-phy of every node: our controller (fail mode secure, see above)
        for node in snapshot.nodes if fab.switches else ():
            key = SwitchKey(BR_PHY, node.name)
            res = result.switches[key] = SwitchResult(key, datapath_id_phy(node.id))
            ovsdb = rec.bootstrapper.nodes.get(node.name)
            if ovsdb is None:
                res.setup, res.reason = "error", "node not bootstrapped"
                continue
            try:
                if (rec.setup_due(node.name) or node.name not in self.phy_ofports) and may_write(datapath_id_phy(node.id)):
                    ensure_bridge(ovsdb, PHY_BRIDGE, datapath_id_phy(node.id), controller_for(node.management_ip),
                                  "secure")
                self.phy_ofports[node.name] = ovsdb.ofports(PHY_BRIDGE)
                port = self.phy_ofports[node.name].get(UNDERLAY_PORT)
                if port and self.phy_ports.get(node.id) != port:
                    self.phy_ports[node.id] = port
                    self._probe_soon.set()     # a new underlay port: its link is learnt now
            except Exception as e:  # noqa: BLE001
                LOG.warning("node %s br-phy: %s", node.name, e)
                self.phy_ofports.pop(node.name, None)   # re-checked on the next pass
                res.setup, res.reason = "error", f"br-phy: {e}"
        return replace(snapshot, fabric=fab.with_ofports(ofports)).with_phy_ofports(self.phy_ofports)

    def phy_moved(self, name: str, ovsdb: NodeOvsdb) -> bool:
        """Whether node `name`'s br-phy port numbers in its OVSDB replica (`ovsdb`) differ from those
        the last pass compiled with (none yet: yes). A VM's interface on br-int moves none."""
        compiled = self.phy_ofports.get(name)
        return compiled is None or ovsdb.ofports(PHY_BRIDGE) != compiled

    def _connect(self, rec, s) -> NodeOvsdb:
        """A fabric switch's OVSDB connection, made on a thread of its own: a pass waits SETUP_WAIT for it at
        most, as for a node's check (a dead fabric switch must not hold up every change of the cloud for its
        connection timeout), and not at all when the fabric switch is in error already; it raises while the
        connection is still being made, and the connection's end wakes a pass."""
        remote = channels.ovsdb_remote(s.management_ip)
        job = self._connecting.get(s.name)
        if job is None or job[0] != remote:
            self._forget_connecting(s.name)   # made for an address the fabric switch no longer has
            future = self._connect_pool.submit(NodeOvsdb, f"tor_{s.name}", s.management_ip,
                                               on_change=lambda _n, what, name=s.name: rec.ovsdb_changed(name, what))
            job = self._connecting[s.name] = (remote, future)
        last = rec.last.switches.get(SwitchKey(FABRIC_SWITCH, s.name))
        wait([job[1]], 0 if last is not None and last.setup == "error" else SETUP_WAIT)
        if not job[1].done():
            job[1].add_done_callback(lambda _f, name=s.name: rec.ovsdb_changed(name, "setup"))
            raise ConnectionError(f"its OVSDB has not answered yet (still connecting after {SETUP_WAIT:g} s)")
        del self._connecting[s.name]
        return job[1].result()

    def _forget_connecting(self, name: str) -> None:
        """A connection being made that no pass will take: closed when it is made."""
        job = self._connecting.pop(name, None)
        if job is not None:
            job[1].add_done_callback(lambda f: f.exception() is None and f.result().close())

    def after_pass(self, rec, snapshot, result) -> None:
        self.last = {"snapshot": snapshot}
        if any(r.changes for k, r in result.switches.items() if k.bridge in (FABRIC_SWITCH, BR_PHY)):
            self._probe_soon.set()   # e.g. the fabric switch's LLDP punt flow, or a br-phy's, just installed

    # ------------------------------------------------------------------------------- LLDP
    def _lldp_loop(self) -> None:
        while not self._stop.is_set():
            if self._probe_soon.wait(self.lldp_interval):
                self._stop.wait(LLDP_SETTLE)
            self._probe_soon.clear()
            if self._stop.is_set():
                break
            try:
                self.send_lldp()
            except Exception:  # noqa: BLE001
                LOG.exception("LLDP probe failed")

    def send_lldp(self) -> int:
        sent = 0
        probes = []   # out of each node's underlay port only: links are learnt where the fabric switch receives them
        for nid, port in list(self.phy_ports.items()):
            probes.append((datapath_id_phy(nid), port))
        cluster = self.reconciler.cluster if self.reconciler is not None else None
        for dpid, port in probes:
            dp = self.app.datapath(dpid)
            if dp is None or cluster is not None and not cluster.masters(dpid):   # a slave's packet-out is refused
                continue
            ofp, parser = dp.ofproto, dp.ofproto_parser
            data = lldp_probe(dpid, port, self._lldp_key)
            dp.send_msg(parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                                            actions=[parser.OFPActionOutput(port, 0)], data=data))
            sent += 1
        self.lldp_sent += sent
        return sent

    def on_packet_in(self, msg) -> bool:
        """True if the packet was an LLDP frame (consumed).

        A link is learnt only from a signed probe that a node's br-phy sent and a fabric switch port received:
        a frame punted by br-phy (where a tenant's VLAN traffic also arrives) or by any other
        switch teaches nothing."""
        data = bytes(msg.data)
        if len(data) < 14 or data[12:14] != b"\x88\xcc":
            return False
        rx_dpid, rx_port = msg.datapath.id, msg.match["in_port"]
        if rx_dpid & DPID_KIND_MASK != DPID_FABRIC:
            return True
        parsed = lldp_parse(data, self._lldp_key)
        if parsed is None:  # someone else's LLDP, or a forged or stale probe
            return True
        src_dpid, src_port = parsed
        if src_dpid & DPID_KIND_MASK != DPID_PHY:
            return True
        sid, ofport, node_id = rx_dpid & DPID_ID_MASK, rx_port, src_dpid & DPID_ID_MASK
        if self.phy_ports.get(node_id) != src_port:   # not from the underlay port we probe
            return True
        self.lldp_received += 1
        name = next((n for n, p in self.fabric_ports.get(sid, {}).items() if p == ofport), None)
        if name is None:
            return True
        key = (sid, name, node_id)
        now = time.monotonic()
        if now - self._lldp_seen.get(key, -LLDP_REFRESH) < LLDP_REFRESH:   # known and recently written
            return True
        self._lldp_seen = {k: v for k, v in self._lldp_seen.items() if k[:2] != key[:2] and k[2] != node_id}
        self._lldp_seen[key] = now
        self._links.submit(self._record_link, key, ofport)
        return True

    def _record_link(self, key: tuple[int, str, int], ofport: int) -> None:
        """The link LLDP found written to the store (on its own thread); a failed write is tried
        again with the next probe."""
        sid, name, node_id = key
        try:
            with self.Session() as session, session.begin():
                news = fops.record_lldp_link(session, sid, name, ofport, node_id)
        except Exception as e:  # noqa: BLE001 - the store away: the next probe writes it
            self._lldp_seen.pop(key, None)
            LOG.warning("LLDP: fabric switch %d port %s faces node %d, not recorded: %s", sid, name, node_id, e)
            return
        if news:
            LOG.info("LLDP: fabric switch %d port %s (%d) faces node %d", sid, name, ofport, node_id)
            self.wake()

    # ------------------------------------------------------------------------------- status API

    def status(self, switch_id: int) -> dict:
        """Per fabric switch port: the node behind it, the VLANs allowed on it (desired, and read from the
        switch) and the VLANs the node's br-int really tags frames with (read from the node). A VLAN
        the node sends but the port does not allow is `vlans_blocked`: the fabric switch drops those frames,
        and the switch is not `in_sync`."""
        snapshot = self.last.get("snapshot")
        with self.Session() as session:
            row = session.get(FabricSwitch, switch_id) if valid_id(switch_id) else None
            if row is None:
                raise NotFound(f"fabric switch {switch_id} does not exist")
            name, status, reason = row.name, row.status, row.status_reason
        dp = self.app.datapath(datapath_id_fabric(switch_id))
        last = self.reconciler.last.desired
        brint = {k.name: state for k, state in last.items() if k.bridge == BR_INT}
        desired = fc.fabric_vlans(snapshot, brint).get(name, {}) if snapshot is not None else {}
        ports = self.fabric_ports.get(switch_id, {})
        actual: dict[str, set[int]] | None = None
        flows_match = None
        flows = sw.read_flows(self.app, dp) if dp is not None else None
        if flows is None:
            dp = None       # not reachable after all: reported as not connected
        else:
            by_no = {p: n for n, p in ports.items()}
            actual = {n: set() for n in ports}
            for f in flows:
                md = f.match_dict
                if f.table == fc.FABRIC_TRUNK_IN and f.priority == fc.PRIO_ALLOW and "in_port" in md:
                    actual.setdefault(by_no.get(md["in_port"], str(md["in_port"])), set()).add(md["vlan_vid"] & 0xFFF)
            want = last.get(SwitchKey(FABRIC_SWITCH, name))
            flows_match = want is not None and {f for f in flows if owns_cookie(f.cookie)} == set(want.flows)
        fab = routers.fabric_state(snapshot) if snapshot is not None else None
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
        node_ids = {n.name: n.id for n in snapshot.nodes} if snapshot is not None else {}
        out_ports = []
        blocked_any = False
        for pname in sorted(set(ports) | set(desired)):
            sent = self._vlans_sent(node_ids.get(faces.get(pname)))
            allowed = actual.get(pname, set()) if actual is not None else None
            blocked = sorted(sent - allowed) if sent is not None and allowed is not None else None
            blocked_any = blocked_any or bool(blocked)
            out_ports.append({"port": pname, "ofport": ports.get(pname), "node": faces.get(pname),
                              "link": sorted(sources.get(pname, ())),
                              "vlans_desired": sorted(desired.get(pname, ())),
                              "vlans": sorted(allowed) if allowed is not None else None,
                              "vlans_sent": sorted(sent) if sent is not None else None,
                              "vlans_blocked": blocked})
        in_sync = None if flows_match is None else flows_match and not blocked_any
        return {"id": switch_id, "name": name, "status": status, "status_reason": reason,
                "connected": dp is not None, "in_sync": in_sync, "ports": out_ports,
                "lldp": {"sent": self.lldp_sent, "received": self.lldp_received}}

    def _vlans_sent(self, node_id: int | None) -> set[int] | None:
        """VLANs a node's br-int tags frames with, read from the switch; None if it is not connected."""
        dp = self.app.datapath(datapath_id(node_id)) if node_id is not None else None
        state = sw.read_state(self.app, dp) if dp is not None else None
        return None if state is None else fc.vlans_sent(state)

    def desired_flows(self, switch_id: int) -> list[str]:
        """The flows a fabric switch must hold (ovs-ofctl syntax)."""
        with self.Session() as session:
            row = session.get(FabricSwitch, switch_id) if valid_id(switch_id) else None
        if row is None:
            raise NotFound(f"fabric switch {switch_id} does not exist")
        want = self.reconciler.last.desired.get(SwitchKey(FABRIC_SWITCH, row.name))
        return want.to_ofctl() if want else []
