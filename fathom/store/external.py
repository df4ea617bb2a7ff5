"""Store operations of external connectivity: external networks' checks, router gateways, floating IPs.

The API calls them inside its one transaction per request, like fathom.store.ops; every refusal
names the request field at fault. External gateways and floating IPs are realised for routers in
mode `distributed` only (fathom/apps/external, docs/external.md): other modes are refused here.
"""
from __future__ import annotations

import ipaddress
from typing import Collection

from sqlalchemy import select
from sqlalchemy.orm import Session

from fathom.store import fabric
from fathom.store import models as m
from fathom.store import ops
from fathom.store.errors import Conflict, Forbidden, Invalid, NotFound
from fathom.store.external_models import CT_ZONE_MAX, CT_ZONE_MIN, FloatingIp, RouterGateway



def _external_network(session: Session, network_id: int, field: str) -> m.Network:
    """An external network by id, whoever asks: external networks are shared by every project (as
    Neutron's router:external), so their existence is no secret."""
    net = session.get(m.Network, network_id) if ops.valid_id(network_id) else None
    if net is None or not net.external:
        raise NotFound(f"external network {network_id} does not exist", field)
    if not ops.subnets_of(session, net.id):
        raise Conflict(f"external network {net.id} has no subnet to take addresses from", field)
    return net


def _allocate_zone(session: Session) -> int:
    ops._serialise(session, ops.LOCK_ZONES, 0)
    used = set(session.scalars(select(RouterGateway.ct_zone))) | set(session.scalars(select(FloatingIp.ct_zone)))
    for zone in range(CT_ZONE_MIN, CT_ZONE_MAX + 1):
        if zone not in used:
            return zone
    raise Conflict("no free conntrack zone for another router gateway or floating IP")


def _address_port(session: Session, project: str, network: m.Network, name: str,
                  ip: ipaddress.IPv4Address | None, field: str) -> m.Port:
    """A port of the external network holding one address for a gateway or floating IP (bound nowhere)."""
    request = {"ip_address": ip} if ip is not None else {"subnet_id": ops.subnets_of(session, network.id)[0].id}
    try:
        return ops.create_port(session, ops.Caller(project=project, admin=True), network_id=network.id, name=name,
                               fixed_ips=[request], project_id=project, port_security=False)
    except (Invalid, Conflict) as e:
        if e.field and e.field.startswith("fixed_ips"):
            e.field = field
        raise


def address_owner(session: Session, port_id: int) -> str | None:
    """What holds its address through this port ("router gateway 3", "floating IP 7"), if anything."""
    gw = session.scalar(select(RouterGateway).where(RouterGateway.address_port_id == port_id))
    if gw is not None:
        return f"the external gateway of router {gw.router_id}"
    fip = session.scalar(select(FloatingIp).where(FloatingIp.address_port_id == port_id))
    return f"floating IP {fip.id}" if fip is not None else None


# ---------------------------------------------------------------------------------------------- gateways


def gateway_of(session: Session, router_id: int) -> RouterGateway | None:
    return session.get(RouterGateway, router_id)


def gateways_of(session: Session, router_ids: Collection[int]) -> dict[int, RouterGateway]:
    """The gateways of those of the routers that have one, by router id, read in one statement."""
    return {g.router_id: g for g in session.scalars(
        select(RouterGateway).where(RouterGateway.router_id.in_(router_ids)))}


def set_gateway(session: Session, caller: ops.Caller, router: m.Router, *, network_id: int,
                ip_address: ipaddress.IPv4Address | None = None, enable_snat: bool = True,
                node: str | None = None) -> RouterGateway:
    """Give the router an external gateway (replacing one on another network or address)."""
    mode = fabric.get_mode(session, router).mode
    if mode != "distributed":
        raise Invalid(f"external gateways are realised for mode distributed routers only (router {router.id} "
                      f"is {mode})", "external_gateway")
    if ip_address is not None and not caller.may_bind:
        raise Forbidden("only an admin or the service identity can choose a router's gateway address",
                        "external_gateway.ip_address")
    if node is not None and not caller.admin:
        raise Forbidden("only an admin can choose a router's gateway node", "external_gateway.node")
    net = _external_network(session, network_id, "external_gateway.network_id")
    if node is not None:
        host = ops.node_by_name(session, node, "external_gateway.node")
        if host.role != "gateway":
            raise Conflict(f"node {node!r} has role {host.role}, not gateway", "external_gateway.node")
    else:
        host = session.scalar(select(m.Node).where(m.Node.role == "gateway").order_by(m.Node.id))
        if host is None:
            raise Conflict("an external gateway needs a node of role gateway: there is none",
                           "external_gateway.network_id")
    gw = gateway_of(session, router.id)
    if gw is not None:
        current = session.get(m.Port, gw.address_port_id)
        same_address = ip_address is None or current.fixed_ips[0].ip_address == str(ip_address)
        if gw.network_id == net.id and same_address:
            gw.snat, gw.node_id = enable_snat, host.id
            router.status = "pending"
            session.flush()
            return gw
        clear_gateway(session, caller, router)
    port = _address_port(session, router.project_id, net, f"router-gateway-{router.id}", ip_address,
                         "external_gateway.ip_address")
    gw = RouterGateway(router_id=router.id, network_id=net.id, address_port_id=port.id, node_id=host.id,
                       ct_zone=_allocate_zone(session), snat=enable_snat)
    session.add(gw)
    router.status = "pending"
    session.flush()
    return gw


def clear_gateway(session: Session, caller: ops.Caller, router: m.Router) -> None:
    gw = gateway_of(session, router.id)
    if gw is None:
        return
    fips = session.scalars(select(FloatingIp.id).where(FloatingIp.router_id == router.id)).all()
    if fips:
        raise Conflict(f"floating IP(s) {sorted(fips)} reach their ports through router {router.id}: "
                       "disassociate them first", "external_gateway")
    port = session.get(m.Port, gw.address_port_id)
    session.delete(gw)
    session.flush()
    session.delete(port)
    session.flush()


def check_mode_change(session: Session, router: m.Router, mode: str) -> None:
    if mode != "distributed" and gateway_of(session, router.id) is not None:
        raise Invalid(f"router {router.id} has an external gateway, realised in mode distributed only: "
                      "clear it first", "mode")


# ---------------------------------------------------------------------------------------------- floating IPs


def create_floating_ip(session: Session, caller: ops.Caller, *, network_id: int,
                       ip_address: ipaddress.IPv4Address | None = None, port_id: int | None = None,
                       fixed_ip: ipaddress.IPv4Address | None = None, name: str = "",
                       project_id: str | None = None, external_id: str | None = None) -> FloatingIp:
    project = ops._owner(caller, project_id)
    if ip_address is not None and not caller.may_bind:
        raise Forbidden("only an admin or the service identity can choose a floating IP's address",
                        "floating_ip_address")
    external_id = ops._external_id(session, caller, FloatingIp, external_id)
    net = _external_network(session, network_id, "floating_network_id")
    port = _address_port(session, project, net, "floating-ip", ip_address, "floating_ip_address")
    fip = FloatingIp(name=name, project_id=project, network_id=net.id, address_port_id=port.id,
                     ip_address=port.fixed_ips[0].ip_address, ct_zone=_allocate_zone(session), status="pending",
                     external_id=external_id)
    session.add(fip)
    session.flush()
    port.name = f"floating-ip-{fip.id}"
    if port_id is not None:
        associate(session, caller, fip, port_id, fixed_ip)
    session.flush()
    return fip


def associate(session: Session, caller: ops.Caller, fip: FloatingIp, port_id: int | None,
              fixed_ip: ipaddress.IPv4Address | None = None) -> FloatingIp:
    """Map the floating IP to a port's fixed IP (None: to nothing). The port must be the floating
    IP's project's and reach the external network through a router with a gateway on it."""
    if port_id is None:
        if fixed_ip is not None:
            raise Invalid("fixed_ip_address needs a port_id", "fixed_ip_address")
        fip.port_id = fip.fixed_ip = fip.router_id = None
        fip.status = "pending"
        session.flush()
        return fip
    # another project's port is refused as if it did not exist (ids of other projects are not revealed)
    port = ops.get(session, ops.Caller(project=fip.project_id, admin=False), m.Port, port_id, "port_id")
    if port.router_id is not None or address_owner(session, port.id) is not None:
        raise Conflict(f"port {port.id} is not a workload port", "port_id")
    addresses = [a for a in port.fixed_ips if fixed_ip is None or a.ip_address == str(fixed_ip)]
    if not addresses:
        raise Invalid(f"port {port.id} has no fixed IP {fixed_ip}" if fixed_ip else f"port {port.id} has no fixed IP",
                      "fixed_ip_address" if fixed_ip else "port_id")
    address = addresses[0]
    other = session.scalar(select(FloatingIp).where(FloatingIp.port_id == port.id, FloatingIp.id != fip.id))
    if other is not None:
        raise Conflict(f"port {port.id} already has floating IP {other.ip_address}", "port_id")
    router_id = _router_towards(session, address.subnet_id, fip.network_id)
    if router_id is None:
        raise Conflict(f"no router joins subnet {address.subnet_id} of port {port.id} to external network "
                       f"{fip.network_id} (add a router interface and an external gateway)", "port_id")
    fip.port_id, fip.fixed_ip, fip.router_id = port.id, address.ip_address, router_id
    fip.status = "pending"
    session.flush()
    return fip


def _router_towards(session: Session, subnet_id: int, external_network_id: int) -> int | None:
    """The router with an interface on the subnet and its gateway on the external network."""
    for interface in session.scalars(select(m.Port).join(m.IpAllocation).where(
            m.IpAllocation.subnet_id == subnet_id, m.Port.router_id.is_not(None))):
        gw = gateway_of(session, interface.router_id)
        if gw is not None and gw.network_id == external_network_id:
            return interface.router_id
    return None


def get_floating_ip(session: Session, caller: ops.Caller, fip_id: int) -> FloatingIp:
    return ops.get(session, caller, FloatingIp, fip_id)


def delete_floating_ip(session: Session, caller: ops.Caller, fip_id: int) -> None:
    fip = ops.get(session, caller, FloatingIp, fip_id)
    port = session.get(m.Port, fip.address_port_id)
    session.delete(fip)
    session.flush()
    if port is not None:
        session.delete(port)
        session.flush()
