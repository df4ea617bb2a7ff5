"""The network-node router (router mode `network-node`): a Linux namespace with ip_forward on the
gateway node, one veth pair per router interface, as Neutron's L3 agent builds it.

In a real cloud this runs on the gateway node itself (the `fathom agent`); in the lab every node
is a namespace of this machine, so the controller process plays the agent: it finds the gateway
node's namespace by its management address and builds the router namespace next to it, named
`<node netns>-r<router id>` (so `fathom lab down` removes it with the rest of the lab).

Per interface N (a router interface = a port of the interface's network, id N):
  router netns: `qr<N>` with the interface's MAC and gateway address/prefix
  node netns:   `qrp<N>` on br-int (fathom.model.routers.router_port_interface), switched by the
                tenant compiler like any port of the network bound to the gateway node.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import re
import subprocess

from fathom.host import exec as host_exec

LOG = logging.getLogger("fathom.l3agent")
ROUTER_NS = re.compile(r"^(.*)-r(\d+)$")   # <node netns>-r<router id>


def _ip(args: list[str], ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return host_exec.run(args, ns, check=check)


def namespaces() -> list[str]:
    out = _ip(["ip", "-j", "netns", "list"], check=False).stdout.strip()
    return [e["name"] for e in json.loads(out)] if out else []


class L3Agent:
    def __init__(self):
        self._node_ns: dict[str, str] = {}   # management ip -> netns
        self.created = False                 # an interface was built since the flag was last cleared

    def node_netns(self, management_ip: str, present: list[str] | None = None) -> str | None:
        """The namespace holding `management_ip` among `present` (default: every namespace now)."""
        present = namespaces() if present is None else present
        ns = self._node_ns.get(management_ip)
        if ns and ns in present:
            return ns
        for ns in present:
            out = _ip(["ip", "-j", "-4", "addr", "show"], ns=ns, check=False).stdout
            try:
                addrs = {i["local"] for link in json.loads(out or "[]") for i in link.get("addr_info", [])}
            except ValueError:
                continue
            if management_ip in addrs:
                self._node_ns[management_ip] = ns
                return ns
        return None

    def sync(self, nodes: dict[str, str], want: dict[str, list], subnets: dict[int, object],
             ovsdb_for) -> dict[int, str]:
        """nodes: node name -> management ip (every node); want: gateway node name -> [RouterInterface]
        to realise there. `ovsdb_for(node)` gives the node's NodeOvsdb (for br-int ports) or None.
        Returns {router id: "ok" | error}; removes the namespaces of routers no longer wanted.

        Only gateway nodes' namespaces are looked up (and the parents of router namespaces to
        remove): a pass over many nodes without network-node routers runs one `ip netns list`."""
        result: dict[int, str] = {}
        present = namespaces()
        wanted_ns: set[str] = set()
        for node, interfaces in want.items():
            mgmt_ip = nodes.get(node)
            ns = self.node_netns(mgmt_ip, present) if mgmt_ip else None
            if ns is None:
                for interface in interfaces:
                    result[interface.router_id] = f"no namespace holds gateway node {node}'s management address"
                continue
            by_router: dict[int, list] = {}
            for interface in interfaces:
                by_router.setdefault(interface.router_id, []).append(interface)
            for router_id, rlegs in by_router.items():
                rns = f"{ns}-r{router_id}"
                wanted_ns.add(rns)
                try:
                    self._ensure_router(ns, rns, rlegs, subnets, ovsdb_for(node))
                    result[router_id] = "ok"
                except Exception as e:  # noqa: BLE001 - reported as the router's status
                    LOG.warning("router %d on %s: %s", router_id, node, e)
                    result[router_id] = str(e)
        # namespaces of routers that left network-node mode (or moved): gone, with their br-int ports
        stale = [ns for ns in present if ROUTER_NS.match(ns) and ns not in wanted_ns]
        if stale:
            ns_node = {}
            for node, mgmt_ip in nodes.items():
                ns = self.node_netns(mgmt_ip, present) if mgmt_ip else None
                if ns:
                    ns_node[ns] = node
            for ns in stale:
                parent = ROUTER_NS.match(ns).group(1)
                if parent in ns_node:
                    self._remove_router(ns, ovsdb_for(ns_node[parent]))
        return result

    def _ensure_router(self, node_ns: str, rns: str, interfaces: list, subnets, ovsdb) -> None:
        if rns not in namespaces():
            _ip(["ip", "netns", "add", rns])
            _ip(["ip", "link", "set", "lo", "up"], ns=rns)
        _ip(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns=rns)
        have = {link["ifname"] for link in json.loads(_ip(["ip", "-j", "link", "show"], ns=rns).stdout or "[]")}
        want = set()
        for interface in interfaces:
            inner, outer = f"qr{interface.id}", f"qrp{interface.id}"
            want.add(inner)
            prefix = ipaddress.IPv4Network(subnets[interface.subnet_id].cidr).prefixlen
            if inner not in have:
                _ip(["ip", "link", "del", outer], ns=node_ns, check=False)
                _ip(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", rns], ns=node_ns)
                _ip(["ip", "link", "set", inner, "address", interface.mac_address], ns=rns)
                _ip(["ip", "addr", "add", f"{interface.ip_address}/{prefix}", "dev", inner], ns=rns)
                for ns_, dev in ((rns, inner), (node_ns, outer)):
                    # AF_PACKET (OVS netdev) sees packets before checksums are filled in
                    _ip(["ethtool", "-K", dev, "tx", "off"], ns=ns_, check=False)
                    _ip(["ip", "link", "set", dev, "up"], ns=ns_)
            if ovsdb is not None and outer not in ovsdb.ofports():
                ovsdb.api.add_port("br-int", outer, may_exist=True).execute(check_error=True)
                self.created = True
        for extra in have - want - {"lo"}:
            if extra.startswith("qr"):
                _ip(["ip", "link", "del", extra], ns=rns, check=False)
                if ovsdb is not None:
                    ovsdb.api.del_port("qrp" + extra[2:], "br-int", if_exists=True).execute(check_error=True)

    def _remove_router(self, rns: str, ovsdb) -> None:
        interfaces = [link["ifname"] for link in json.loads(_ip(["ip", "-j", "link", "show"], ns=rns, check=False).stdout
                                                       or "[]") if link["ifname"].startswith("qr")]
        _ip(["ip", "netns", "del", rns], check=False)
        for interface in interfaces:
            if ovsdb is not None:
                try:
                    ovsdb.api.del_port("qrp" + interface[2:], "br-int", if_exists=True).execute(check_error=True)
                except Exception:  # noqa: BLE001 - the next pass retries
                    pass
        LOG.info("removed router namespace %s", rns)
