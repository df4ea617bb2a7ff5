"""The node's tunnel address on br-phy, kept by the agent.

OVS makes a bridge's device anew when its datapath type changes (the controller moves br-phy to
`netdev` on a host without the OVS kernel module), and a bridge on `system` without that module has
no device at all: an address put on br-phy by hand is gone, and the node's VXLAN with it. The agent
is told the address (`fathom agent run --tunnel-address 198.18.0.11/24`) and puts it back, with the
link up, whenever br-phy's device is new. At rest that is one ifindex look-up (no command) a second.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
import threading
import time

from fathom.agent.local import ipv4_addresses
from fathom.host.exec import run

LOG = logging.getLogger("fathom.agent.underlay")


def ifindex(dev: str, ns: str | None = None) -> int | None:
    """`dev`'s interface index (None: no such device); here without a command, in `ns` with `ip`."""
    if ns is None:
        try:
            return socket.if_nametoindex(dev)
        except OSError:
            return None
    out = run(["ip", "-j", "link", "show", "dev", dev], ns, check=False).stdout
    try:
        return json.loads(out)[0]["ifindex"]
    except (ValueError, IndexError, KeyError):
        return None


class TunnelAddress:
    def __init__(self, address: str, dev: str = "br-phy", ns: str | None = None):
        self.address = ipaddress.IPv4Interface(address)   # ValueError names a bad one
        if self.address.network.prefixlen == 32 and "/" not in address:
            raise ValueError(f"tunnel address {address}: give its prefix length, e.g. {address}/24")
        self.dev, self.ns = dev, ns
        self.seen: int | None = None     # the device index the address was last made sure on

    def check(self) -> bool:
        """Put the address on the device (and the link up) if the device is new; True if it did."""
        index = ifindex(self.dev, self.ns)
        if index is None or index == self.seen:
            return False
        added = self.address not in ipv4_addresses(self.ns, self.dev)
        if added:
            run(["ip", "addr", "add", str(self.address), "dev", self.dev], self.ns)
        run(["ip", "link", "set", self.dev, "up"], self.ns)
        self.seen = index
        if added:
            LOG.info("%s (ifindex %d): tunnel address %s put back", self.dev, index, self.address)
        return added

    def run(self, stopping: threading.Event, interval: float = 1.0) -> None:
        _keep(self, stopping, interval, f"keeping tunnel address {self.address}")


class TunnelRoutes:
    """OVS's routes to the tunnel networks as its own user routes (`ovs-appctl ovs/route/add`).

    A userspace (netdev) datapath encapsulates VXLAN itself and looks the remote tunnel address up
    in OVS's copy of the host's routes. OVS rebuilds that copy on every link change of the host (a
    VM's port plugged or unplugged): it drops the host's routes and reads them again, and a
    revalidation in between finds no route and turns the node's tunnel flows into drops for a few
    milliseconds (the other VMs' packets lost). User routes stay through the rebuild, so the agent
    adds one for each network of `dev`'s IPv4 addresses (the tunnel address's), at once when they
    change, else every `recheck` seconds (a restarted ovs-vswitchd has none). At rest that is one
    `ip addr` a second and one `ovs-appctl` every `recheck` seconds."""

    def __init__(self, appctl, dev: str = "br-phy", ns: str | None = None, recheck: float = 10.0):
        self.appctl, self.dev, self.ns, self.recheck = appctl, dev, ns, recheck
        self.seen: list[str] | None = None   # the networks the routes were last made sure for
        self.checked = 0.0                   # monotonic time of that

    def check(self) -> list[str]:
        """Add the user routes missing for the device's networks; the networks added."""
        networks = (sorted({str(a.network) for a in ipv4_addresses(self.ns, self.dev)})
                    if ifindex(self.dev, self.ns) else [])
        if networks == self.seen and time.monotonic() < self.checked + self.recheck:
            return []
        shown = self.appctl("ovs/route/show")
        added = [n for n in networks
                 if not re.search(rf"^User: {re.escape(n)} dev {re.escape(self.dev)}\b", shown, re.M)]
        for network in added:
            self.appctl("ovs/route/add", network, self.dev)
            LOG.info("%s: OVS user route to %s added (tunnel lookups survive OVS's route rebuilds)", self.dev, network)
        self.seen, self.checked = networks, time.monotonic()
        return added

    def run(self, stopping: threading.Event, interval: float = 1.0) -> None:
        _keep(self, stopping, interval, "keeping OVS's routes to the tunnel networks")


def _keep(keeper, stopping: threading.Event, interval: float, what: str) -> None:
    """`keeper.check()` every `interval` seconds until `stopping`; a failure is logged and the next
    look starts afresh."""
    while not stopping.is_set():
        try:
            keeper.check()
        except Exception as e:   # noqa: BLE001 - a failed command: try again on the next look
            LOG.warning("%s: %s: %s", keeper.dev, what, e)
            keeper.seen = None
        stopping.wait(interval)
