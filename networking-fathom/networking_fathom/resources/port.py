"""Neutron ports -> fathom ports, with their binding: `binding:host_id` names the fathom node, and
the interface is the one Nova/os-vif plugs into br-int for the port: `tap` + the first 11 characters
of the port's UUID. Neutron's MAC and fixed IPs are used as given (Neutron's IPAM is the authority)."""
from __future__ import annotations

from neutron_lib.api.definitions import portbindings
from neutron_lib import constants as n_const
from neutron_lib.plugins import directory

from .base import Mapping, ipv4

ROUTER_INTERFACE_OWNERS = (n_const.DEVICE_OWNER_ROUTER_INTF, n_const.DEVICE_OWNER_DVR_INTERFACE,
                           n_const.DEVICE_OWNER_HA_REPLICATED_INT)
# Ports fathom does not hold (yet): gateways and floating IPs come with external networks; fathom
# answers DHCP-less (addresses are configured from the port) and runs no metadata proxy.
NOT_MAPPED_OWNERS = (n_const.DEVICE_OWNER_ROUTER_GW, n_const.DEVICE_OWNER_FLOATINGIP,
                     n_const.DEVICE_OWNER_DHCP, n_const.DEVICE_OWNER_DISTRIBUTED)
UNBOUND = (portbindings.VIF_TYPE_UNBOUND, portbindings.VIF_TYPE_BINDING_FAILED, "", None)


def interface_name(port_id: str) -> str:
    """The VIF's name on the node, as Nova names an OVS VIF (nova.network.model NIC_NAME_LEN = 14)."""
    return ("tap" + port_id)[:14]


def bound_host(obj: dict) -> str | None:
    host = obj.get(portbindings.HOST_ID)
    return host if host and obj.get(portbindings.VIF_TYPE) not in UNBOUND else None


class Port(Mapping):
    kind = "port"
    collection = "ports"
    order = 3
    immutable = ("network_id", "mac_address", "fixed_ips")
    mutable = ("name", "node", "interface_name", "port_security")

    def wanted(self, obj, refs):
        owner = obj.get("device_owner") or ""
        if owner in ROUTER_INTERFACE_OWNERS or owner in NOT_MAPPED_OWNERS:
            return None
        host = bound_host(obj)
        return {"network_id": refs.id("networks", obj["network_id"]), "name": (obj.get("name") or "")[:255],
                "mac_address": obj["mac_address"],
                "fixed_ips": [{"subnet_id": refs.id("subnets", f["subnet_id"]), "ip_address": f["ip_address"]}
                              for f in obj.get("fixed_ips", []) if ipv4(f["ip_address"])],
                "node": host, "interface_name": interface_name(obj["id"]) if host else None,
                "port_security": obj.get("port_security_enabled", True) is not False,
                "external_id": obj["id"]}

    def is_mine(self, fathom_obj):
        return fathom_obj.get("router_id") is None

    def current(self, fathom_obj):
        return {**fathom_obj, "fixed_ips": [{"subnet_id": f["subnet_id"], "ip_address": f["ip_address"]}
                                            for f in fathom_obj.get("fixed_ips", [])]}

    def neutron_objects(self, context):
        return directory.get_plugin().get_ports(context)
