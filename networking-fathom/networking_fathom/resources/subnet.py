"""Neutron subnets -> fathom subnets (IPv4 only: fathom's address plan is IPv4), with their DHCP
options. fathom holds what its DHCP servers can give: at most 5 IPv4 DNS servers and 20 host routes
whose next hop is an address of the subnet (a client cannot reach another); the rest is left out
and logged, as Neutron's own DHCP agent cannot use it either."""
from __future__ import annotations

import ipaddress
import logging

from neutron_lib.plugins import directory

from .base import Mapping

LOG = logging.getLogger(__name__)
MAX_DNS_NAMESERVERS = 5
MAX_HOST_ROUTES = 20


def _dns(obj: dict) -> list[str]:
    out = []
    for d in obj.get("dns_nameservers") or []:
        try:
            if ipaddress.ip_address(d).version == 4 and d not in out:
                out.append(d)
        except ValueError:
            pass
    if len(out) > MAX_DNS_NAMESERVERS:
        LOG.warning("subnet %s: only the first %d DNS servers go to fathom", obj["id"], MAX_DNS_NAMESERVERS)
    return out[:MAX_DNS_NAMESERVERS]


def _host_routes(obj: dict) -> list[dict]:
    cidr = ipaddress.ip_network(obj["cidr"], strict=False)
    out, left = [], []
    for r in obj.get("host_routes") or []:
        try:
            dest = ipaddress.ip_network(r["destination"], strict=False)
            hop = ipaddress.ip_address(r["nexthop"])
        except (KeyError, ValueError):
            left.append(r)
            continue
        if dest.version == 4 and hop in cidr and hop not in (cidr.network_address, cidr.broadcast_address):
            out.append({"destination": str(dest), "nexthop": str(hop)})
        else:
            left.append(r)
    if left or len(out) > MAX_HOST_ROUTES:
        LOG.warning("subnet %s: host routes left out (next hop not in the subnet, or beyond %d): %s",
                    obj["id"], MAX_HOST_ROUTES, left + out[MAX_HOST_ROUTES:])
    return out[:MAX_HOST_ROUTES]


class Subnet(Mapping):
    kind = "subnet"
    collection = "subnets"
    order = 1
    immutable = ("network_id", "cidr", "gateway_ip")
    mutable = ("name", "enable_dhcp", "dns_nameservers", "host_routes")

    def wanted(self, obj, refs):
        if obj.get("ip_version") != 4:
            return None
        return {"network_id": refs.id("networks", obj["network_id"]), "cidr": obj["cidr"],
                "gateway_ip": obj.get("gateway_ip") or None, "name": (obj.get("name") or "")[:255],
                "enable_dhcp": bool(obj.get("enable_dhcp", True)), "dns_nameservers": _dns(obj),
                "host_routes": _host_routes(obj), "external_id": obj["id"]}

    def neutron_objects(self, context):
        return directory.get_plugin().get_subnets(context)
