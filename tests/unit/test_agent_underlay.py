"""The agent keeps the node's tunnel address on br-phy when OVS makes the bridge's device anew (a
datapath type change) or makes it late (a `system` bridge on a host without the OVS kernel module,
moved to `netdev` by the controller): a real device in a namespace, removed and made again."""
from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path

import pytest

from fathom.agent.local import ipv4_addresses
from fathom.agent.underlay import TunnelAddress, TunnelRoutes, ifindex
from fathom.host.exec import run
from fathom.lab.ovs import OvsInstance

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ns():
    """A network namespace (root needed: without it `ip netns add` fails, and so does the test)."""
    name = f"zo-underlay-{os.getpid()}"
    run(["ip", "netns", "add", name])
    yield name
    run(["ip", "netns", "del", name], check=False)


def _device(ns: str) -> None:
    """A br-phy as OVS makes one: a new device, no address, down (a veth: no dummy module here)."""
    run(["ip", "link", "add", "br-phy", "type", "veth", "peer", "name", "phy-peer"], ns)


def _up(ns: str, dev: str) -> bool:
    return "UP" in json.loads(run(["ip", "-j", "link", "show", "dev", dev], ns).stdout)[0]["flags"]


def test_the_address_comes_back_on_a_new_device(ns):
    keeper = TunnelAddress("198.18.0.11/24", ns=ns)
    assert keeper.check() is False                      # no br-phy yet (system bridge, no module)
    _device(ns)
    assert keeper.check() is True
    want = {ipaddress.IPv4Interface("198.18.0.11/24")}
    assert ipv4_addresses(ns, "br-phy") == want and _up(ns, "br-phy")
    assert keeper.check() is False                      # same device: nothing to do, no command but the look-up
    # the datapath type changes: OVS deletes the device and makes a new one, without the address
    first = ifindex("br-phy", ns)
    run(["ip", "link", "del", "br-phy"], ns)
    _device(ns)
    assert ifindex("br-phy", ns) != first and ipv4_addresses(ns, "br-phy") == set()
    assert keeper.check() is True
    assert ipv4_addresses(ns, "br-phy") == want and _up(ns, "br-phy")


def test_an_address_already_there_is_kept_as_it_is(ns):
    _device(ns)
    run(["ip", "addr", "add", "198.18.0.11/24", "dev", "br-phy"], ns)
    keeper = TunnelAddress("198.18.0.11/24", ns=ns)
    assert keeper.check() is False and _up(ns, "br-phy")
    assert ipv4_addresses(ns, "br-phy") == {ipaddress.IPv4Interface("198.18.0.11/24")}


def test_the_address_needs_its_prefix():
    with pytest.raises(ValueError, match="prefix length"):
        TunnelAddress("198.18.0.11")


def test_deploy_md_br_phy_on_real_ovs_keeps_its_address_across_a_datapath_type_change(ns, tmp_path):
    """docs/deploy.md's br-phy commands as written (eth1 a veth here), on a real OVS in a namespace;
    the agent's keeper puts the tunnel address on br-phy. Then the bridge's datapath type changes, as
    the controller changes it: OVS deletes the device (and the address with it) and makes it anew;
    the keeper puts the address back."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    block = re.search(r"^dp=\$\(.*?^sudo ip addr flush dev eth1$", doc, re.S | re.M)
    assert block, "docs/deploy.md: the br-phy commands (dp=..., add-br br-phy, ip addr flush dev eth1)"
    ovs = OvsInstance(ns, tmp_path)
    ovs.start()
    try:
        run(["ip", "link", "add", "eth1", "type", "veth", "peer", "name", "eth1-peer"], ns)
        run(["bash", "-e", "-c", 'sudo() { "$@"; }\n' + block.group(0)], ns, env=ovs.env)
        keeper = TunnelAddress("198.18.0.11/24", ns=ns)
        assert keeper.check() is True
        want = {ipaddress.IPv4Interface("198.18.0.11/24")}
        assert ipv4_addresses(ns, "br-phy") == want and _up(ns, "br-phy")
        first = ifindex("br-phy", ns)
        other = "netdev" if ovs.vsctl("get", "bridge", "br-phy", "datapath_type") == "system" else "system"
        for dp in (other, ovs.vsctl("get", "bridge", "br-phy", "datapath_type")):
            ovs.vsctl("set", "bridge", "br-phy", f"datapath_type={dp}")
        assert ifindex("br-phy", ns) not in (None, first)
        assert ipv4_addresses(ns, "br-phy") == set()      # what an operator's `ip addr add` lost
        assert keeper.check() is True
        assert ipv4_addresses(ns, "br-phy") == want and _up(ns, "br-phy")
    finally:
        ovs.stop()


def test_ovs_keeps_a_user_route_to_the_tunnel_network_through_its_route_rebuilds(ns, tmp_path):
    """The agent's TunnelRoutes on a real OVS in a namespace: a netdev br-phy with the tunnel
    address gets an OVS user route to its network, which stays when OVS rebuilds its routes (a link
    of the host deleted, as a VM's port is), and is made again after ovs-vswitchd restarted."""
    ovs = OvsInstance(ns, tmp_path)
    ovs.start()
    try:
        ovs.vsctl("add-br", "br-phy", "--", "set", "bridge", "br-phy", "datapath_type=netdev")
        run(["ip", "addr", "add", "198.18.0.11/24", "dev", "br-phy"], ns)
        run(["ip", "link", "set", "br-phy", "up"], ns)
        routes = TunnelRoutes(lambda *args: ovs.appctl(*args), ns=ns)
        user = re.compile(r"^User: 198\.18\.0\.0/24 dev br-phy\b", re.M)
        assert routes.check() == ["198.18.0.0/24"]
        assert user.search(ovs.appctl("ovs/route/show"))
        assert routes.check() == []                        # same device and networks: no command
        run(["ip", "link", "add", "vm-tap", "type", "veth", "peer", "name", "vm-peer"], ns)
        run(["ip", "link", "del", "vm-tap"], ns)
        assert user.search(ovs.appctl("ovs/route/show"))
        ovs.stop()
        ovs.start()                                         # OVS's routes made anew: no user routes
        run(["ip", "addr", "replace", "198.18.0.11/24", "dev", "br-phy"], ns)
        assert not user.search(ovs.appctl("ovs/route/show"))
        routes.checked -= routes.recheck                    # its next look
        assert routes.check() == ["198.18.0.0/24"]
        assert user.search(ovs.appctl("ovs/route/show"))
    finally:
        ovs.stop()
