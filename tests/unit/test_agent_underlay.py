"""The agent keeps the node's tunnel address on br-phy when OVS makes the bridge's device anew (a
datapath type change) or makes it late (a `system` bridge on a host without the OVS kernel module,
moved to `netdev` by the controller): a real device in a namespace, removed and made again."""
from __future__ import annotations

import ipaddress
import json
import os

import pytest

from fathom.agent.local import ipv4_addresses
from fathom.agent.underlay import TunnelAddress, ifindex
from fathom.host.exec import run


@pytest.fixture
def ns():
    if os.geteuid() != 0:
        pytest.skip("needs root (a network namespace)")
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
