"""Which br-int interfaces belong to the fabric itself, and so can never be a tenant's port.

fathom creates on every node: the VXLAN tunnel port (`vxlan0`), the patch pair to br-phy
(`patch-phy` / `patch-int`), the bridges' own internal ports (`br-int`, `br-phy`, `br-fabric`),
the br-int legs of network-node routers (`qrp<N>`), the DHCP ports of networks (`dhp<N>`) and a
gateway node's external port (`ext0`). A port bound to one of them would
classify what arrives there (every tenant's tunnelled or uplink traffic) into one network, so
the API refuses such a binding and the tenant compiler refuses to compile one (both use this).
The prefixes are reserved as a whole, so that a tunnel type or router leg added later is covered.
"""
from __future__ import annotations

import re

RESERVED = re.compile(r"^(vxlan|genev|gre[0-9]|patch-|br-|qrp[0-9]|dhp[0-9]|ovs-|ext[0-9])", re.IGNORECASE)


def is_infrastructure_interface(name: str | None) -> bool:
    return bool(name) and RESERVED.match(name) is not None
