"""Network-node routers on this node: one namespace per router, as Neutron's L3 agent builds them.

Per router R (fathom.model.hostlocal.RouterNamespace): the namespace `<prefix>R` with IPv4
forwarding and IPv6 off; per interface N a veth pair: `qr<N>` inside it with the interface's MAC and gateway
address, `qrp<N>` here on br-int (the tenant compiler switches it like any port of the network
bound to this node). The prefix names the namespaces this agent owns (`fathom-r` by default; the
lab uses `<lab>-<node>-r`, so that `fathom lab down` removes them with the rest of the lab).

`apply` is idempotent and repairs in place: it creates what is missing, fixes a wrong address or
MAC, removes legs and namespaces no longer wanted, and never rebuilds what is right, so an agent
restart leaves every router forwarding.
"""
from __future__ import annotations

import ipaddress
import logging

from fathom.agent.local import LocalOvs, NamespaceObjects, bring_up_veth, links, namespaces, set_ipv4_addresses
from fathom.host.exec import run
from fathom.model.hostlocal import RouterNamespace

LOG = logging.getLogger("fathom.agent.routers")
BRIDGE = "br-int"


class Routers(NamespaceObjects):
    KIND = RouterNamespace.KIND
    LABEL = "router"

    def __init__(self, ovs: LocalOvs, prefix: str = "fathom-r"):
        super().__init__(ovs, prefix)

    def key(self, obj: RouterNamespace) -> int:
        return obj.router_id

    def ensure(self, obj: RouterNamespace) -> list[str]:
        """Build or repair one router; what had to change (nothing: [])."""
        changed = []
        rns = self.namespace(obj.router_id)
        if rns not in namespaces():
            run(["ip", "netns", "add", rns])
            run(["ip", "link", "set", "lo", "up"], rns)
            changed.append("namespace created")
        if run(["sysctl", "-n", "net.ipv4.ip_forward"], rns).stdout.strip() != "1":
            run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], rns)
            changed.append("forwarding on")
        # an IPv4 router: its legs must not solicit routers or report multicast groups on the
        # tenant networks (frames that outlive the namespace's VLANs on the trunk when it moves)
        for scope in ("all", "default"):
            if run(["sysctl", "-n", f"net.ipv6.conf.{scope}.disable_ipv6"], rns).stdout.strip() != "1":
                run(["sysctl", "-qw", f"net.ipv6.conf.{scope}.disable_ipv6=1"], rns)
                changed.append(f"IPv6 off ({scope})")
        inside = {link["ifname"]: link for link in links(rns)}
        here = {link["ifname"]: link for link in links()}
        br_ports = self.ovs.ports(BRIDGE)
        for leg in obj.legs:
            inner, outer = leg.inner, leg.outer
            if inner not in inside or outer not in here:
                run(["ip", "link", "del", outer], check=False)
                run(["ip", "link", "del", inner], rns, check=False)
                run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", rns])
                changed.append(f"leg {inner} created")
                inside[inner] = {"ifname": inner, "address": None, "flags": []}
                here[outer] = {"ifname": outer, "flags": []}
            if (inside[inner].get("address") or "").lower() != leg.mac.lower():
                run(["ip", "link", "set", inner, "address", leg.mac], rns)
                changed.append(f"{inner} mac")
            changed += set_ipv4_addresses(rns, inner, {ipaddress.IPv4Interface(leg.address)})
            bring_up_veth(((rns, inner, inside[inner]), (None, outer, here[outer])))
            if outer not in br_ports:
                self.ovs.add_port(BRIDGE, outer)
                changed.append(f"{outer} on {BRIDGE}")
        legs = {leg.inner for leg in obj.legs}
        for extra in sorted(set(inside) - legs):
            if extra.startswith("qr"):
                run(["ip", "link", "del", extra], rns, check=False)
                self.ovs.del_port(BRIDGE, "qrp" + extra[2:])
                changed.append(f"leg {extra} removed")
        return changed

    def remove(self, router_id: int) -> None:
        rns = self.namespace(router_id)
        legs = [link["ifname"] for link in links(rns) if link["ifname"].startswith("qr")]
        run(["ip", "netns", "del", rns], check=False)
        for leg in legs:
            self.ovs.del_port(BRIDGE, "qrp" + leg[2:])
            run(["ip", "link", "del", "qrp" + leg[2:]], check=False)
        LOG.info("router %d: namespace %s removed", router_id, rns)
