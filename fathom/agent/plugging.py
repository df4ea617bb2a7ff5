"""How a port's VIF is plugged on this node, and so where PPTMon's programs can run for it.

The controller names a port by the interface on br-int that carries it (`Port.interface`). What
PPTMon needs is the *VM-facing* host interface — the first one the VM's packets cross — and that
its packets pass TC ingress there before any switch has taken them:

- hybrid plugging (OpenStack's os-vif `ovs_hybrid_plug`, used with the iptables_hybrid firewall):
  the VM's tap `tapX` is a port of a per-port Linux bridge `qbrX`, a veth pair `qvbX` (on qbrX) /
  `qvoX` (on br-int) joins it to OVS. br-int holds qvoX; the VM-facing interface is tapX, received
  by the Linux bridge, whose rx_handler runs *after* TC ingress: the programs see and rewrite the
  packets first, whatever datapath OVS runs;
- direct plugging on OVS's kernel datapath (`system`): the interface is a port of the datapath
  (its master is `ovs-system`), whose rx_handler also runs after TC ingress: it works there;
- direct plugging on the userspace datapath (`netdev`): OVS reads the interface through a packet
  socket, which the kernel serves *before* TC ingress — the programs would see the packet but OVS
  would forward it unchanged: no VNF time in the option, and a sink's removal of the option lost.
  This cannot work.

Decided from iproute2's JSON (`ip -d -j link show`, netlink: right in whatever namespace the agent
runs), never from the controller, which cannot see the plugging.
"""
from __future__ import annotations

from dataclasses import dataclass

from fathom.agent.local import links


@dataclass(frozen=True)
class Placement:
    """Where the programs go for a port whose br-int interface is `ovs_interface`: `interface`
    (None when they cannot go anywhere), how the VIF is plugged (hybrid | kernel | netdev |
    absent) and, when `interface` is None, why."""
    ovs_interface: str
    interface: str | None
    plugging: str
    reason: str | None = None


def _kind(link: dict | None, key: str = "info_kind") -> str | None:
    return ((link or {}).get("linkinfo") or {}).get(key)


def vm_facing(ovs_interface: str, node: str, found: list[dict] | None = None) -> Placement:
    """The placement for `ovs_interface` on this node (`node`: its name, for the reason).
    `found`: `ip -d -j link show` of this namespace (read when not given)."""
    by_name = {link.get("ifname"): link for link in (links(details=True) if found is None else found)}
    dev = by_name.get(ovs_interface)
    if dev is None:
        return Placement(ovs_interface, None, "absent", f"waiting for interface {ovs_interface!r} on node {node}")
    # hybrid: a veth whose peer (here, named by `link`) is on a Linux bridge with exactly one other port
    peer = by_name.get(dev.get("link")) if _kind(dev) == "veth" else None
    bridge = by_name.get((peer or {}).get("master"))
    if peer is not None and _kind(bridge) == "bridge":
        ports = [name for name, link in by_name.items() if link.get("master") == bridge["ifname"]]
        if len(ports) == 2:
            return Placement(ovs_interface, next(p for p in ports if p != peer["ifname"]), "hybrid")
    if _kind(by_name.get(dev.get("master"))) == "openvswitch":
        return Placement(ovs_interface, ovs_interface, "kernel")
    return Placement(ovs_interface, None, "netdev",
                     f"{ovs_interface} is plugged directly into OVS, and node {node} runs OVS's netdev datapath, which "
                     "takes a VM's packets before TC ingress: PPTMon could neither time the VNF nor remove its "
                     "option there (it needs hybrid plugging or the kernel datapath)")
