"""ARP in OpenFlow terms: the Ethernet types and operations a flow matches, and the actions that
answer a request on the switch (every app that answers ARP for an address it owns uses them)."""
from __future__ import annotations

from fathom.openflow.spec import OFPP_IN_PORT, Move, Output, SetField

ETH_TYPE_IPV4 = 0x0800
ETH_TYPE_ARP = 0x0806
ARP_REQUEST = 1
ARP_REPLY = 2


def arp_reply_actions(mac: str, ip: str) -> tuple:
    """Turn an ARP request for `ip` into the reply `ip is-at mac`, sent back where it came from."""
    return (
        Move("eth_src", "eth_dst", 48),
        SetField("eth_src", mac),
        SetField("arp_op", ARP_REPLY),
        Move("arp_sha", "arp_tha", 48),
        SetField("arp_sha", mac),
        Move("arp_spa", "arp_tpa", 32),
        SetField("arp_spa", ip),
        Output(OFPP_IN_PORT),
    )
