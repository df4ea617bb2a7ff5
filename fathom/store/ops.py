"""Store operations behind the REST API: checks, allocations and writes, all inside the caller's
transaction (the API opens one per request, so a failed request leaves the store unchanged).

Every check raises a `fathom.store.errors` error naming the request field at fault. Checks are done
in code first, for clear messages; the unique constraints of the schema are the backstop against
concurrent writers.
"""
from __future__ import annotations

import functools
import ipaddress
import secrets
import threading
import weakref
from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from sqlalchemy import bindparam, delete, event, false, func, insert, null, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session, aliased

from fathom.pipeline.infrastructure import is_infrastructure_interface
from fathom.store import changes, fabric
from fathom.store import models as m
from fathom.store.base import utcnow
from fathom.store.db import NeedsTransaction, at_once, driver_sql, run_prepared
from fathom.store.external_models import FloatingIp, RouterGateway
from fathom.store.errors import Conflict, Forbidden, Invalid, NotFound

VXLAN_MAX = (1 << 24) - 1
VLAN_MAX = 4094
# Locally administered, unicast: 02:fd:xx:xx:xx:xx.
MAC_PREFIX = "02:fd"


@dataclass(frozen=True)
class Caller:
    """Who makes a request: a project, and whether they are an admin (who sees every project).

    `service`: the service identity (e.g. a Neutron driver) acting for `project`; like an admin it
    may set a port's binding (`node`, `interface_name`), unlike one it sees that project only.
    """
    project: str = "admin"
    admin: bool = True
    service: bool = False

    @property
    def may_bind(self) -> bool:
        return self.admin or self.service


@dataclass(frozen=True)
class Settings:
    """Ranges segmentation ids are allocated from when a request gives none (inclusive)."""
    vxlan_range: tuple[int, int] = (5000, 65535)
    vlan_range: tuple[int, int] = (100, 999)


UNSET = object()   # "not given" where None is a meaningful value (gateway_ip: None = no gateway)


# ---------------------------------------------------------------------------------------------- helpers


def _visible(caller: Caller, obj) -> bool:
    return caller.admin or obj.project_id == caller.project


# Ids are 32-bit signed columns on PostgreSQL: a larger (or non-positive) id names no object.
MAX_ID = 2 ** 31 - 1
# Pagination of every list: `limit` at most MAX_LIMIT (also the default), `marker` = the last id seen.
MAX_LIMIT = 1000


def keep(session: Session, *objects) -> None:
    """Hold `objects` for as long as the session: `session.get` then finds them without a query
    (the session's identity map alone holds unchanged objects weakly)."""
    session.info.setdefault("fathom_kept", []).extend(o for o in objects if o is not None)


def valid_id(object_id: int | None) -> bool:
    return object_id is not None and 0 < object_id <= MAX_ID


def get(session: Session, caller: Caller, model, object_id: int, field: str | None = None, options: Sequence = ()):
    """The object, or NotFound (also for objects of another project: their ids are not revealed).
    `options`: loader options (the relationships the caller reads, loaded with it)."""
    obj = session.get(model, object_id, options=options) if valid_id(object_id) else None
    if obj is None or not _visible(caller, obj):
        raise NotFound(f"{model.__tablename__[:-1]} {object_id} does not exist", field)
    return obj


def list_objects(session: Session, caller: Caller, model, *, limit: int = MAX_LIMIT,
                 marker: int | None = None, options: Sequence = (), **filters) -> Sequence:
    """The caller's objects in id order: at most `limit`, those after id `marker` when given.
    `options`: loader options (the relationships the caller reads for every object, loaded in one
    query each rather than one per object)."""
    query = select(model).options(*options).order_by(model.id).limit(min(limit, MAX_LIMIT))
    if not caller.admin:
        query = query.where(model.project_id == caller.project)
    if marker is not None:
        query = query.where(model.id > min(marker, MAX_ID))
    for column, value in filters.items():
        if value is None:
            continue
        if column.endswith("_id") and isinstance(value, int) and not valid_id(value):
            return []
        query = query.where(getattr(model, column) == value)
    return session.scalars(query).all()


def _owner(caller: Caller, requested: str | None, parent=None) -> str:
    """The project a new object belongs to: admins may choose; others get their own."""
    if requested is not None and requested != caller.project and not caller.admin:
        raise Forbidden("only an admin can create objects for another project", "project_id")
    if requested is not None:
        return requested
    return parent.project_id if parent is not None and caller.admin else caller.project


def _serialise(session: Session, domain: int, key: int) -> None:
    """Queue this transaction behind others allocating in the same (domain, key) until commit.

    PostgreSQL: a transaction-scoped advisory lock, so two requests do not both pick the same
    "lowest free" VNI (or both create a project's default security group). SQLite needs none: its
    writers are serialised already (fathom.store.db begins them IMMEDIATE).
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:domain, :key)"),
                        {"domain": domain, "key": key})


# _serialise domains, one per kind of allocation (key 0 in each)
LOCK_SEGMENTS = 1        # VNIs and VLAN ids of networks
LOCK_DEFAULT_GROUP = 2   # creating a project's default security group
LOCK_ZONES = 3           # conntrack zones of the external app


def _external_id(session: Session, caller: Caller, model, external_id: str | None) -> str | None:
    """The id the driving cloud gives the object (Neutron's UUID): set by the admin or the service
    identity only (a member could otherwise take a UUID the driver will need), unique per table."""
    if external_id is None:
        return None
    if not caller.may_bind:
        raise Forbidden("only an admin or the service identity can set external_id", "external_id")
    if session.scalar(select(model.id).where(model.external_id == external_id)) is not None:
        raise Conflict(f"external_id {external_id} is in use", "external_id")
    return external_id


def require_admin(caller: Caller, what: str) -> None:
    if not caller.admin:
        raise Forbidden(f"only an admin can {what}")


# ---------------------------------------------------------------------------------------------- nodes


def create_node(session: Session, caller: Caller, *, name: str, role: str = "compute",
                tunnel_ip: str | None = None, management_ip: str | None = None,
                datapath_type: str | None = None) -> m.Node:
    require_admin(caller, "manage nodes")
    if session.scalar(select(m.Node).where(m.Node.name == name)):
        raise Conflict(f"a node named {name!r} exists", "name")
    _check_tunnel_ip_free(session, tunnel_ip, None)
    node = m.Node(name=name, role=role, tunnel_ip=tunnel_ip, management_ip=management_ip,
                  datapath_type=datapath_type, project_id=caller.project, state="init", status="pending")
    session.add(node)
    session.flush()
    return node


def _check_tunnel_ip_free(session: Session, tunnel_ip: str | None, node_id: int | None) -> None:
    if tunnel_ip is None:
        return
    other = session.scalar(select(m.Node).where(m.Node.tunnel_ip == tunnel_ip))
    if other is not None and other.id != node_id:
        raise Conflict(f"node {other.name!r} already has tunnel_ip {tunnel_ip}", "tunnel_ip")


def update_node(session: Session, caller: Caller, node_id: int, changes: dict) -> m.Node:
    require_admin(caller, "manage nodes")
    node = get(session, caller, m.Node, node_id)
    if "tunnel_ip" in changes:
        _check_tunnel_ip_free(session, changes["tunnel_ip"], node.id)
    for key, value in changes.items():
        setattr(node, key, value)
    node.status = "pending"
    session.flush()
    return node


def delete_node(session: Session, caller: Caller, node_id: int) -> None:
    require_admin(caller, "manage nodes")
    node = get(session, caller, m.Node, node_id)
    bound = session.scalar(select(func.count()).select_from(m.Port).where(m.Port.node_id == node.id))
    if bound:
        raise Conflict(f"node {node.name!r} still has {bound} bound port(s)")
    hosted = sorted(session.scalars(select(RouterGateway.router_id).where(RouterGateway.node_id == node.id)))
    if hosted:
        raise Conflict(f"node {node.name!r} hosts the external gateway of router(s) {hosted}")
    session.delete(node)
    session.flush()


def node_by_name(session: Session, name: str, field: str = "node") -> m.Node:
    node = session.scalar(select(m.Node).where(m.Node.name == name))
    if node is None:
        raise NotFound(f"node {name!r} does not exist", field)
    return node


# ---------------------------------------------------------------------------------------------- networks


def create_network(session: Session, caller: Caller, settings: Settings, *, name: str, type: str,
                   segmentation_id: int | None = None, project_id: str | None = None,
                   external: bool = False, upstream_mac: str | None = None,
                   external_id: str | None = None) -> m.Network:
    """`external`: a provider network reaching the gateway nodes' external port (docs/external.md);
    `external_id`: the id of the object in the system that manages it (Neutron), if any."""
    project = _owner(caller, project_id)
    _serialise(session, LOCK_SEGMENTS, 0)
    if external and not caller.may_bind:
        raise Forbidden("only an admin or the service identity can create an external network", "external")
    if upstream_mac is not None and not external:
        raise Invalid("upstream_mac is for external networks only", "upstream_mac")
    if external and type == "vxlan":
        raise Invalid("an external network is a provider network: flat or vlan", "type")
    # the service identity too: Neutron's type drivers allocate the segments it then asks for
    if segmentation_id is not None and not caller.may_bind:
        raise Forbidden("only an admin or the service identity can choose a segmentation id", "segmentation_id")
    external_id = _external_id(session, caller, m.Network, external_id)
    if type == "flat":
        if segmentation_id is not None:
            raise Invalid("a flat network has no segmentation id", "segmentation_id")
        # There is one uplink (and one external port): untagged frames on it belong to one network only.
        if session.scalar(select(m.Network).where(m.Network.type == "flat", m.Network.external == external)):
            raise Conflict("a flat network exists already (one per uplink)" if not external else
                           "a flat external network exists already (one per external port)", "type")
    else:
        top = VXLAN_MAX if type == "vxlan" else VLAN_MAX
        # with a fabric switch, VLAN ids must come from the fabric's range
        fabric_range = fabric.check_network_vlan(session, segmentation_id) if type == "vlan" else None
        if segmentation_id is None:
            segmentation_id = _allocate_segment(session, type, settings, fabric_range)
        elif not 1 <= segmentation_id <= top:
            raise Invalid(f"a {type} segmentation id is 1..{top}", "segmentation_id")
        elif _segment_used(session, type, segmentation_id):
            raise Conflict(f"{type} segmentation id {segmentation_id} is in use", "segmentation_id")
    network = m.Network(name=name, type=type, segmentation_id=segmentation_id, project_id=project,
                        external=external, upstream_mac=upstream_mac, status="pending", external_id=external_id)
    session.add(network)
    session.flush()
    return network


def _segment_used(session: Session, type: str, segmentation_id: int) -> bool:
    return session.scalar(select(m.Network.id).where(
        m.Network.type == type, m.Network.segmentation_id == segmentation_id)) is not None


def _allocate_segment(session: Session, type: str, settings: Settings,
                      bounds: tuple[int, int] | None = None) -> int:
    low, high = bounds or (settings.vxlan_range if type == "vxlan" else settings.vlan_range)
    used = set(session.scalars(select(m.Network.segmentation_id).where(
        m.Network.type == type, m.Network.segmentation_id.between(low, high))))
    for candidate in range(low, high + 1):
        if candidate not in used:
            return candidate
    raise Conflict(f"no free {type} segmentation id in {low}-{high}", "segmentation_id")


def delete_network(session: Session, caller: Caller, network_id: int) -> None:
    network = get(session, caller, m.Network, network_id)
    ports = session.scalar(select(func.count()).select_from(m.Port).where(m.Port.network_id == network.id))
    if ports:
        raise Conflict(f"network {network.id} still has {ports} port(s) (router interfaces included)")
    session.execute(delete(m.Subnet).where(m.Subnet.network_id == network.id))
    session.delete(network)
    session.flush()


# ---------------------------------------------------------------------------------------------- subnets


def subnets_of(session: Session, network_id: int) -> list[m.Subnet]:
    return list(session.scalars(select(m.Subnet).where(m.Subnet.network_id == network_id)
                                .order_by(m.Subnet.id)))


def create_subnet(session: Session, caller: Caller, *, network_id: int, cidr: ipaddress.IPv4Network,
                  gateway_ip=UNSET, name: str = "", project_id: str | None = None,
                  external_id: str | None = None, enable_dhcp: bool = True, dns_nameservers=(),
                  host_routes=()) -> m.Subnet:
    """`host_routes`: (destination network, nexthop address) pairs; the nexthop must be a host
    address of the subnet. The API bounds and checks the shapes (fathom.api.schemas)."""
    network = get(session, caller, m.Network, network_id, "network_id")
    project = _owner(caller, project_id, network)
    external_id = _external_id(session, caller, m.Subnet, external_id)
    if cidr.prefixlen > 30:
        raise Invalid("a subnet needs room for hosts: prefix length 30 at most", "cidr")
    if gateway_ip is UNSET:
        gateway_ip = next(cidr.hosts())
    if gateway_ip is not None:
        _check_host_address(cidr, gateway_ip, "gateway_ip")
    for other in subnets_of(session, network.id):
        if other.prefix_overlaps(cidr):
            raise Conflict(f"{cidr} overlaps subnet {other.id} ({other.cidr}) of the network", "cidr")
    subnet = m.Subnet(name=name, network_id=network.id, cidr=str(cidr),
                      gateway_ip=None if gateway_ip is None else str(gateway_ip),
                      project_id=project, status="pending", external_id=external_id,
                      enable_dhcp=enable_dhcp, dns_nameservers=[str(ip) for ip in dns_nameservers],
                      host_routes=_host_routes(cidr, host_routes), dhcp_status=[])
    session.add(subnet)
    session.flush()
    return subnet


def _host_routes(cidr: ipaddress.IPv4Network, routes) -> list[dict]:
    out = []
    for i, (destination, nexthop) in enumerate(routes):
        _check_host_address(cidr, ipaddress.IPv4Address(nexthop), f"host_routes.{i}.nexthop")
        out.append({"destination": str(destination), "nexthop": str(nexthop)})
    return out


def update_subnet(session: Session, caller: Caller, subnet_id: int, *, name: str | None = None,
                  enable_dhcp: bool | None = None, dns_nameservers=None, host_routes=None) -> m.Subnet:
    """Change the given fields (None: unchanged) in place: the DHCP servers follow."""
    subnet = get(session, caller, m.Subnet, subnet_id)
    if name is not None:
        subnet.name = name
    if enable_dhcp is not None:
        subnet.enable_dhcp = enable_dhcp
    if dns_nameservers is not None:
        subnet.dns_nameservers = [str(ip) for ip in dns_nameservers]
    if host_routes is not None:
        subnet.host_routes = _host_routes(subnet.prefix, host_routes)
    session.flush()
    return subnet


def _check_host_address(cidr: ipaddress.IPv4Network, ip: ipaddress.IPv4Address, field: str) -> None:
    if ip not in cidr:
        raise Invalid(f"{ip} is outside the subnet {cidr}", field)
    if ip in (cidr.network_address, cidr.broadcast_address):
        raise Invalid(f"{ip} is the network or broadcast address of {cidr}", field)


def delete_subnet(session: Session, caller: Caller, subnet_id: int) -> None:
    subnet = get(session, caller, m.Subnet, subnet_id)
    users = session.scalars(select(m.Port).join(m.IpAllocation).where(
        m.IpAllocation.subnet_id == subnet.id)).all()
    routers = sorted({p.router_id for p in users if p.router_id is not None})
    if routers:
        raise Conflict(f"subnet {subnet.id} is an interface of router(s) {routers}")
    if users:
        raise Conflict(f"subnet {subnet.id} still has addresses of port(s) {sorted(p.id for p in users)}")
    session.delete(subnet)
    session.flush()


# ---------------------------------------------------------------------------------------------- ports


@dataclass
class NewPort:
    """A port that create_port's checks allowed and its addresses chosen, not written yet: the ports
    row's columns (`values`), its node, and its addresses as (subnet id, address). `claim`: the
    subnet (with its network) one address is still to be taken from, by insert_port's statement
    (new_port's `claim_at_insert`); insert_port adds it to `addresses`."""
    values: dict
    node: NodeRef | None
    addresses: list[tuple[int, str]]
    claim: tuple[NetworkRef, SubnetRef] | None = None
    default_group: int | None = None   # the id of the project's default security group, if it has one


def create_port(session: Session, caller: Caller, *, network_id: int, name: str = "",
                mac_address: str | None = None, fixed_ips: list[dict] | None = None,
                node: str | None = None, interface_name: str | None = None,
                port_security: bool = True, project_id: str | None = None,
                router_id: int | None = None, external_id: str | None = None, flush: bool = True) -> m.Port:
    """`fixed_ips`: [{"subnet_id": int?, "ip_address": IPv4Address?}]; None = one from the first
    subnet, [] = none. `router_id` is for router interfaces (see add_router_interface). `flush`:
    False leaves the port pending, for the caller to add what belongs with it (its security groups)
    and flush once."""
    new = new_port(session, caller, network_id=network_id, name=name, mac_address=mac_address,
                   fixed_ips=fixed_ips, node=node, interface_name=interface_name, port_security=port_security,
                   project_id=project_id, router_id=router_id, external_id=external_id)
    # one flush: the port and its addresses in one go
    port = m.Port(**new.values,
                  fixed_ips=[m.IpAllocation(subnet_id=subnet_id, network_id=new.values["network_id"], ip_address=ip)
                             for subnet_id, ip in new.addresses])
    session.add(port)
    if flush:
        session.flush()
    return port


def new_port(session: Session, caller: Caller, *, network_id: int, name: str = "",
             mac_address: str | None = None, fixed_ips: list[dict] | None = None,
             node: str | None = None, interface_name: str | None = None,
             port_security: bool = True, project_id: str | None = None,
             router_id: int | None = None, external_id: str | None = None,
             claim_at_insert: bool = False) -> NewPort:
    """The checks of a new port and the choice of its MAC and addresses (create_port's arguments):
    what create_port or insert_port writes. `claim_at_insert`: on PostgreSQL, the one address of a
    port given no `fixed_ips` is taken by insert_port's statement (one statement less), not here;
    for a caller whose further checks cannot fail (the address is the last thing decided)."""
    found = _port_context(session, caller, network_id, project_id, mac_address, node, interface_name, external_id)
    network = found.network
    if network is None or not _visible(caller, network):
        raise NotFound(f"network {network_id} does not exist", "network_id")
    project = _owner(caller, project_id, network)
    # No lock on the network: concurrent creations in one network take different addresses
    # (`_allocate_ip` holds what it hands out until the transaction ends, in this process and, on
    # PostgreSQL, for every other); the unique constraints are the backstop, and
    # fathom.api.deps.Store.write runs such a request again.
    if mac_address is None:
        mac_address = _allocate_mac(session, network.id)
    elif found.mac_used:
        raise Conflict(f"MAC {mac_address} is in use in network {network.id}", "mac_address")
    check_binding(caller, node, interface_name)
    if external_id is not None:
        if not caller.may_bind:
            raise Forbidden("only an admin or the service identity can set external_id", "external_id")
        if found.external_id_used:
            raise Conflict(f"external_id {external_id} is in use", "external_id")
    if node is not None and found.node is None:
        raise NotFound(f"node {node!r} does not exist", "node")
    if found.interface_used:
        raise Conflict(f"interface {interface_name!r} on node {node!r} is bound to another port", "interface_name")
    subnets = found.subnets if fixed_ips != [] else []
    claim = None
    if fixed_ips is None and subnets and claim_at_insert and session.get_bind().dialect.name == "postgresql":
        claim, fixed_ips = (network, subnets[0]), []
    if fixed_ips is None:
        fixed_ips = [{"subnet_id": subnets[0].id}] if subnets else []
    chosen: list[tuple[SubnetRef, ipaddress.IPv4Address]] = []
    for i, request in enumerate(fixed_ips):
        chosen.append(_choose_ip(session, network, subnets, request, f"fixed_ips.{i}",
                                 gateway_allowed=router_id is not None, taken={str(ip) for _, ip in chosen}))
    return NewPort(dict(name=name, network_id=network.id, mac_address=mac_address,
                        node_id=found.node.id if found.node is not None else None, interface_name=interface_name,
                        port_security=port_security, router_id=router_id, project_id=project,
                        status="pending", status_reason=None, external_id=external_id),
                   found.node, [(subnet.id, str(ip)) for subnet, ip in chosen], claim, found.default_group)


# a new port's rows written with SQLAlchemy Core (insert_port): each statement built once
_PORTS, _ADDRESSES, _LINKS = m.Port.__table__, m.IpAllocation.__table__, m.PortSecurityGroup.__table__
_INSERT_PORT = insert(_PORTS).returning(_PORTS.c.id)
_INSERT_ADDRESS = insert(_ADDRESSES)
_INSERT_LINK = insert(_LINKS)


# PostgreSQL's allocation in one statement (_allocate_claimed; a part of _CLAIMED_ROWS): the
# window's first address that is not allocated (an index probe each, a scalar subquery: never a
# hashed scan of the network's addresses), not taken by this request already, and whose
# transaction-level advisory lock this transaction gets without waiting (another holds it: the next
# address). The CASE reads the address before it tries the lock, and LIMIT stops at the first: no
# lock is taken on an address in use or beyond the one chosen. The lock's key is in the one-bigint
# key space (the two-int4 locks of _serialise are another): network << 32 | address, above 2^32,
# never a hashtext() of fathom.cluster.leases.
_FIRST_FREE = (
    "SELECT n FROM generate_series(CAST(:low AS bigint), CAST(:high AS bigint)) AS n "
    "WHERE n <> ALL(CAST(:skip AS bigint[])) AND CASE WHEN (SELECT 1 FROM ip_allocations "
    "WHERE network_id = :network_id AND ip_address = host(inet '0.0.0.0' + n) LIMIT 1) IS NULL "
    "THEN pg_try_advisory_xact_lock(CAST(:key_base AS bigint) + n) ELSE false END LIMIT 1")


# PostgreSQL: the port, its addresses and its links in one statement (data-modifying CTEs; the
# addresses and groups as arrays). The change trackers cannot read such a statement: insert_port
# tells them the port's rows itself (fathom.store.changes.port_rows_written).
_PORT_COLUMNS = ("name", "network_id", "mac_address", "node_id", "interface_name", "port_security", "router_id",
                 "project_id", "status", "status_reason", "external_id", "created_at")
_INSERT_PORT_ROWS = text(
    f"WITH p AS (INSERT INTO ports ({', '.join(_PORT_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in _PORT_COLUMNS)}) RETURNING id), "
    "a AS (INSERT INTO ip_allocations (port_id, subnet_id, network_id, ip_address) "
    "SELECT p.id, x.subnet_id, :network_id, x.ip FROM p, "
    "unnest(CAST(:subnet_ids AS integer[]), CAST(:ips AS varchar[])) AS x(subnet_id, ip)), "
    "l AS (INSERT INTO port_security_groups (port_id, group_id) "
    "SELECT p.id, g FROM p, unnest(CAST(:group_ids AS integer[])) AS g) "
    "SELECT id FROM p")


# PostgreSQL, a port whose address insert_port takes (NewPort.claim): the same, with the address claimed
# in the statement (_FIRST_FREE over the window of the subnet's hint: the port is inserted only if it
# finds one). The port's values are cast to their columns' types (they are a SELECT's, not a VALUES
# list's), without a length: the column's own bound applies, as it does to an INSERT's values.
def _cast(column: str) -> str:
    kind = _PORTS.c[column].type.compile(dialect=postgresql.dialect()).split("(")[0]
    return f"CAST(:{column} AS {kind})"


_CLAIMED_ROWS = (
    f"WITH c AS ({_FIRST_FREE}), "
    f"p AS (INSERT INTO ports ({', '.join(_PORT_COLUMNS)}) SELECT {', '.join(map(_cast, _PORT_COLUMNS))} "
    "FROM c RETURNING id), "
    "a AS (INSERT INTO ip_allocations (port_id, subnet_id, network_id, ip_address) "
    "SELECT p.id, :subnet_id, :network_id, host(inet '0.0.0.0' + c.n) FROM p, c), "
    "l AS (INSERT INTO port_security_groups (port_id, group_id) "
    "SELECT p.id, g FROM p, unnest(CAST(:group_ids AS integer[])) AS g)")
# the request's Idempotency-Key and its answer (AnswerRow, its fields as answer_*) written with them:
# one statement less a creation
_KEY_ROW = (
    ", k AS (INSERT INTO request_ids (scope, key, fingerprint, created, status, content_type, "
    "body) SELECT CAST(:answer_scope AS varchar), CAST(:answer_key AS varchar), CAST(:answer_fingerprint AS varchar), "
    "CAST(:created_at AS timestamp with time zone), CAST(:answer_status AS integer), "
    "CAST(:answer_content_type AS varchar), CAST(:answer_head AS bytea) || convert_to(CAST(p.id AS text), 'UTF8') || "
    "CAST(:answer_middle AS bytea) || convert_to(host(inet '0.0.0.0' + c.n), 'UTF8') || CAST(:answer_tail AS bytea) "
    "FROM p, c)")
# what the statement wrote as the change feed's notice says it (fathom.cluster.feed.payload of
# {("port", id), changes.port_at(id, None, node, network)})
_PORT_WRITTEN = ("'[[\"port\",' || CAST(p.id AS text) || '],[\"port_at\",[' || CAST(p.id AS text) || ',null,' || "
                 "COALESCE(CAST(:node_id AS text), 'null') || ',' || CAST(:network_id AS text) || ']]]'")
_PSYCOPG = postgresql.psycopg.dialect()


@functools.cache
def _claim_port_rows_sql(answered: bool, notice: str | None) -> str:
    """_CLAIMED_ROWS as the driver runs it (run_prepared), selecting the port's id and its address's
    number; with the request's key and answer (`answered`: _KEY_ROW), and with the change feed's
    notice (`notice`, its SQL: changes.notice_in_statement) and the transaction's id after them."""
    told = f", pg_current_xact_id()::text, {notice}" if notice is not None else ""
    return driver_sql(text(f"{_CLAIMED_ROWS}{_KEY_ROW if answered else ''} SELECT p.id, c.n{told} FROM p, c"),
                      _PSYCOPG)[0]


@dataclass
class AnswerRow:
    """The request's Idempotency-Key row (fathom.api.request_ids), written by insert_port's claiming
    statement with the port's rows: its columns but the body, and the body's parts around the port's
    id and its claimed address (body = head, id, middle, address, tail: both known only to the
    statement). `written`: whether the statement wrote it (not when the address was claimed otherwise:
    the caller writes it then)."""
    scope: str
    key: str
    fingerprint: str
    status: int
    content_type: str
    head: bytes
    middle: bytes
    tail: bytes
    written: bool = False

    def body(self, port_id: int, address: str) -> bytes:
        return b"".join((self.head, str(port_id).encode(), self.middle, address.encode(), self.tail))


def insert_port(session: Session, new: NewPort, group_ids: list[int], created: datetime | None = None,
                answer: AnswerRow | None = None) -> tuple[int, datetime]:
    """Write a new port (new_port), its addresses and its security groups' links (checked by the
    caller: fathom.store.secgroups.new_port_groups) on the session's connection, without the ORM's
    unit of work: the API's most frequent write. Its id and creation time (`created`, else now). A
    port with an address to claim (NewPort.claim) has it in `new.addresses` after, and `answer`
    written with it. A session whose statements commit as they run (db.at_once) writes only that
    way, in one statement: anything else raises NeedsTransaction, before it writes."""
    conn = session.connection()
    created = created or utcnow()
    if new.claim is not None:
        port_id = _insert_claiming(session, new, group_ids, created, answer)
        if port_id is not None:
            return port_id, created
    if at_once(session):
        raise NeedsTransaction("the port's rows take more than one statement")
    if new.claim is not None:
        network, subnet = new.claim   # nothing free in the hint's window: the whole search, then the rows
        new.addresses.append((subnet.id, str(_allocate_ip(session, network, subnet, "fixed_ips.0"))))
    if conn.dialect.name == "postgresql":
        port_id = conn.scalar(_INSERT_PORT_ROWS, {
            **new.values, "created_at": created, "subnet_ids": [subnet_id for subnet_id, _ in new.addresses],
            "ips": [ip for _, ip in new.addresses], "group_ids": list(group_ids)})
        changes.port_rows_written(conn, port_id)
        _port_written(conn, port_id, new)
        return port_id, created
    port_id = conn.scalar(_INSERT_PORT, {**new.values, "created_at": created})
    changes.port_inserted(conn, port_id)
    _port_written(conn, port_id, new)
    network_id = new.values["network_id"]
    if new.addresses:
        conn.execute(_INSERT_ADDRESS, [{"port_id": port_id, "subnet_id": subnet_id, "network_id": network_id,
                                        "ip_address": ip} for subnet_id, ip in new.addresses])
    if group_ids:
        conn.execute(_INSERT_LINK, [{"port_id": port_id, "group_id": g} for g in group_ids])
    return port_id, created


def _insert_claiming(session: Session, new: NewPort, group_ids: list[int], created: datetime,
                     answer: AnswerRow | None) -> int | None:
    """_CLAIMED_ROWS (with `answer`'s row): the port's id, its address added to `new.addresses`;
    None (nothing written) when no address of the hint's window is free. A statement that commits on
    its own (db.at_once) writes the change feed's notice too, where the engine has one."""
    network, subnet = new.claim
    first, last = _host_range(subnet.cidr)
    start = first + _hints(session).get(subnet.id, 0)
    skip = [int(ipaddress.IPv4Address(subnet.gateway_ip))] if subnet.gateway_ip else []
    conn = session.connection()
    params = {**new.values, "created_at": created, "subnet_id": subnet.id, "group_ids": list(group_ids),
              "low": start, "high": min(start + ALLOCATION_WINDOW - 1, last), "skip": skip,
              "key_base": network.id << 32}
    if answer is not None:
        params.update({f"answer_{name}": value for name, value in vars(answer).items() if name != "written"})
    told = changes.notice_in_statement(conn) if at_once(session) else None
    notice = None
    if told is not None:
        notice, notice_params = told.notice(_PORT_WRITTEN)
        params.update(notice_params)
    rows = run_prepared(conn, _claim_port_rows_sql(answer is not None, notice), params)
    if not rows:
        return None
    port_id, found = rows[0][:2]
    if told is not None:
        told.noticed(int(rows[0][2]), {("port", port_id), changes.port_at(port_id, None, new.values["node_id"],
                                                                          new.values["network_id"])})
    else:
        _port_written(conn, port_id, new)
    _hints(session)[subnet.id] = found - first
    new.addresses.append((subnet.id, str(ipaddress.IPv4Address(found))))
    changes.port_rows_written(conn, port_id, told)
    if answer is not None:
        answer.written = True
    return port_id


def _port_written(conn, port_id: int, new: NewPort) -> None:
    changes.port_written(conn, port_id, None, new.values["node_id"], new.values["network_id"])


@functools.lru_cache(maxsize=1024)
def _host_range(cidr: str) -> tuple[int, int]:
    """A subnet's first and last host address, as integers."""
    prefix = ipaddress.IPv4Network(cidr)
    return int(prefix.network_address) + 1, int(prefix.broadcast_address) - 1


@dataclass(frozen=True)
class NetworkRef:
    """What a new port's checks read of its network."""
    id: int
    project_id: str


@dataclass(frozen=True)
class SubnetRef:
    """What a new port's address choice reads of a subnet (as m.Subnet names it)."""
    id: int
    cidr: str
    gateway_ip: str | None

    @property
    def prefix(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.cidr)


@dataclass(frozen=True)
class NodeRef:
    id: int
    name: str


@dataclass
class _PortContext:
    network: NetworkRef | None
    subnets: list[SubnetRef]
    node: NodeRef | None
    interface_used: bool
    mac_used: bool
    external_id_used: bool
    default_group: int | None


def _port_context(session: Session, caller: Caller, network_id: int, project_id: str | None,
                  mac_address: str | None, node: str | None, interface_name: str | None,
                  external_id: str | None) -> _PortContext:
    """Everything a new port's checks read, in one query of the columns they read (no ORM objects:
    loading them cost more than the query): the network and its subnets (in id order), the node
    named, whether the interface, the MAC or the external id is taken, and the id of the port's
    project's default security group. Nothing is decided here: create_port raises the errors in its
    own order (so a member naming a node is told it may not, not whether the node exists)."""
    if not valid_id(network_id):
        return _PortContext(None, [], None, False, False, False, None)
    # the port's project as _owner decides it: the one asked for, else the network's for an admin
    # (resolved in the query), else the caller's
    project = project_id if project_id is not None else (None if caller.admin else caller.project)
    shape = (node is not None, interface_name is not None, mac_address is not None, external_id is not None,
             project is not None)
    params = {"network_id": network_id, "project": project, "node": node, "interface_name": interface_name,
              "mac_address": mac_address, "external_id": external_id}
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        statement, defaults = _port_context_sql(*shape)
        rows = run_prepared(conn, statement, {**defaults, **params})
    else:
        rows = conn.execute(_port_context_query(*shape), params).all()
    if not rows:
        return _PortContext(None, [], None, False, False, False, None)
    # the columns of _port_context_query, in its order
    network, project_of, _, _, _, node_id, node_name, default_group, interface_used, mac_used, external_used = rows[0]
    return _PortContext(NetworkRef(network, project_of),
                        [SubnetRef(r[2], r[3], r[4]) for r in rows if r[2] is not None],
                        NodeRef(node_id, node_name) if node_id is not None else None,
                        interface_used is not None, mac_used is not None, external_used is not None, default_group)


@functools.cache
def _port_context_sql(*shape: bool) -> tuple[str, dict]:
    """_port_context_query as PostgreSQL's driver runs it (run_prepared)."""
    return driver_sql(_port_context_query(*shape), _PSYCOPG)


@functools.cache
def _port_context_query(node: bool, interface: bool, mac: bool, external_id: bool, project: bool):
    """The query of _port_context for the parameters given (built once per shape: building and
    caching a statement costs more than running it). One row per subnet (one row with none): the
    network LEFT JOIN its subnets, the node and the default group; the "taken" checks as scalar
    subqueries."""
    other, bound_node = aliased(m.Port), aliased(m.Node)

    def taken(*where):
        return select(other.id).where(*where).limit(1).scalar_subquery()
    # the interface's check names both columns of the ports' unique (node_id, interface_name) index,
    # the node's id as a subquery of its own: a generic plan made while the table was small (a
    # prepared statement's, kept until the table's next ANALYZE) then probes that index, not a
    # scan of every index entry for the interface's name
    node_id = select(bound_node.id).where(bound_node.name == bindparam("node")).scalar_subquery()
    checks = [
        (taken(other.node_id == node_id, other.interface_name == bindparam("interface_name"))
         if node and interface else null()).label("interface_used"),
        (taken(other.network_id == bindparam("network_id"), other.mac_address == bindparam("mac_address"))
         if mac else null()).label("mac_used"),
        (taken(other.external_id == bindparam("external_id")) if external_id else null()).label("external_id_used")]
    return (select(m.Network.id.label("network_id"), m.Network.project_id.label("network_project"),
                   m.Subnet.id.label("subnet_id"), m.Subnet.cidr, m.Subnet.gateway_ip,
                   m.Node.id.label("node_id"), m.Node.name.label("node_name"),
                   m.DefaultSecurityGroup.group_id.label("default_group"), *checks).select_from(m.Network)
            .outerjoin(m.Subnet, m.Subnet.network_id == m.Network.id)
            .outerjoin(m.Node, m.Node.name == bindparam("node") if node else false())
            .outerjoin(m.DefaultSecurityGroup, m.DefaultSecurityGroup.project_id ==
                       (bindparam("project") if project else m.Network.project_id))
            .where(m.Network.id == bindparam("network_id")).order_by(m.Subnet.id))


def _allocate_mac(session: Session, network_id: int) -> str:
    """A random MAC (32 random bits): not checked against the network's ports, as a clash is
    unlikely (n / 2^32 with n ports) and the unique constraint refuses it (Store.write then runs
    the request again, with another MAC)."""
    return MAC_PREFIX + "".join(f":{b:02x}" for b in secrets.token_bytes(4))


def _check_interface_free(session: Session, node: m.Node, interface: str, port_id: int | None) -> None:
    other = session.scalar(select(m.Port).where(m.Port.node_id == node.id,
                                                m.Port.interface_name == interface))
    if other is not None and other.id != port_id:
        # names neither the other port nor its project: it may be another tenant's
        raise Conflict(f"interface {interface!r} on node {node.name!r} is bound to another port",
                       "interface_name")


def check_binding(caller: Caller, node: str | None, interface_name: str | None) -> None:
    """Binding a port to a node's interface is the cloud's job (as Neutron's binding:host_id):
    only an admin or the service identity may; and an interface fathom itself created on a node
    (tunnel, uplink, patch ports, bridges, router legs) is never a tenant port, whoever asks."""
    for field, value in (("node", node), ("interface_name", interface_name)):
        if value is not None and not caller.may_bind:
            raise Forbidden(f"only an admin or the service identity can set a port's {field}", field)
    if interface_name is not None and is_infrastructure_interface(interface_name):
        raise Invalid(f"{interface_name!r} is an interface of the fabric itself, not a tenant port",
                      "interface_name")


def _ip_used(session: Session, network_id: int, ip: str) -> bool:
    # the allocation queries run on the session's connection (Core): no ORM statement machinery or
    # autoflush on the create path (create_port flushes its allocations before it returns)
    return session.connection().scalar(_IP_USED, {"network_id": network_id, "ip": ip}) is not None


def _choose_ip(session: Session, network: NetworkRef, subnets: list[SubnetRef], request: dict, field: str,
               gateway_allowed: bool, taken: set[str]) -> tuple[SubnetRef, ipaddress.IPv4Address]:
    """The subnet and address for one fixed IP request; `taken`: addresses this request chose already."""
    subnet_id = request.get("subnet_id")
    ip = request.get("ip_address")
    if subnet_id is not None:
        subnet = next((s for s in subnets if s.id == subnet_id), None)
        if subnet is None:
            raise Invalid(f"subnet {subnet_id} is not a subnet of network {network.id}",
                          f"{field}.subnet_id")
    elif ip is not None:
        subnet = next((s for s in subnets if ip in s.prefix), None)
        if subnet is None:
            raise Invalid(f"{ip} is outside every subnet of network {network.id}", f"{field}.ip_address")
    else:
        raise Invalid("give subnet_id, ip_address or both", field)

    if ip is None:
        return subnet, _allocate_ip(session, network, subnet, field, taken)
    _check_host_address(subnet.prefix, ip, f"{field}.ip_address")
    if not gateway_allowed and subnet.gateway_ip == str(ip):
        raise Conflict(f"{ip} is the gateway address of subnet {subnet.id}", f"{field}.ip_address")
    if str(ip) in taken or _ip_used(session, network.id, str(ip)):
        raise Conflict(f"{ip} is in use in network {network.id}", f"{field}.ip_address")
    return subnet, ip


# Where each subnet's search for a free address starts: every host address below that index was
# taken when last looked at (per engine's pool, which its execution_options() variants share, per
# subnet id). A hint only: the address chosen is always
# checked against the store, and the unique constraint is the backstop. Freeing an address lowers the
# hint (delete_port, remove_router_interface), so the lowest free address is still the one
# allocated, without reading every allocation of the subnet.
_free_from: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
ALLOCATION_WINDOW = 32   # candidates checked per query

class _Reservations:
    """Addresses handed out by this process's transactions, per network (one instance per engine).

    An address chosen is held until its transaction ends: a concurrent allocation skips it instead
    of waiting for that transaction (its row is invisible until the commit). A committed address
    stays skipped by the allocations whose query started before that commit (they may not have
    seen it), and is forgotten once none of those is left; a rolled-back one is free at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, set[str]] = {}                  # network -> addresses of open transactions
        self._committed: dict[int, dict[str, int]] = {}       # network -> address -> commit number
        self._commits = 0
        self._running: dict[object, int] = {}                 # allocation -> commits seen at its start

    def start(self, allocation: object) -> None:
        """Call before the query that reads which addresses are taken."""
        with self._lock:
            self._running[allocation] = self._commits

    def reserve(self, allocation: object, network_id: int, address: str) -> bool:
        with self._lock:
            seen = self._running[allocation]
            if address in self._held.get(network_id, ()) or \
                    self._committed.get(network_id, {}).get(address, -1) > seen:
                return False
            self._held.setdefault(network_id, set()).add(address)
            return True

    def finish(self, allocation: object) -> None:
        with self._lock:
            self._running.pop(allocation, None)
            self._prune()

    def release(self, held: list[tuple[int, str]], committed: bool) -> None:
        with self._lock:
            if committed:
                self._commits += 1
            for network_id, address in held:
                addresses = self._held.get(network_id)
                if addresses is not None:
                    addresses.discard(address)
                    if not addresses:
                        del self._held[network_id]
                if committed:
                    self._committed.setdefault(network_id, {})[address] = self._commits
            self._prune()

    def _prune(self) -> None:
        oldest = min(self._running.values(), default=self._commits)
        for network_id in list(self._committed):
            kept = {a: n for a, n in self._committed[network_id].items() if n > oldest}
            if kept:
                self._committed[network_id] = kept
            else:
                del self._committed[network_id]


_reservations: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # engine's pool -> _Reservations
_reservations_lock = threading.Lock()
RESERVED = "fathom_reserved_addresses"   # session.info key: [(network id, address)] of this transaction


def _hints(session: Session) -> dict[int, int]:
    return _free_from.setdefault(session.get_bind().pool, {})


def _reservations_of(session: Session) -> _Reservations:
    with _reservations_lock:
        return _reservations.setdefault(session.get_bind().pool, _Reservations())


def _hold(session: Session, network_id: int, address: str) -> None:
    """Note a reservation in the session that made it, released when its transaction ends: the
    release is listened for on that session alone (not on every SQLAlchemy session of the process)."""
    held = session.info.get(RESERVED)
    if held is None:
        held = session.info[RESERVED] = []
        if not event.contains(session, "after_transaction_end", _release):
            event.listen(session, "after_commit", _release_committed)
            event.listen(session, "after_transaction_end", _release)
    held.append((network_id, address))


def _release_committed(session: Session) -> None:
    if RESERVED in session.info and not session.in_nested_transaction():   # a savepoint is no commit
        _reservations_of(session).release(session.info.pop(RESERVED), committed=True)


def _release(session: Session, transaction) -> None:
    if transaction.parent is None and RESERVED in session.info:   # rolled back: free again
        _reservations_of(session).release(session.info.pop(RESERVED), committed=False)


def _freed(session: Session, allocations) -> None:
    """Addresses of `allocations` are being freed: searches of their subnets start at them again."""
    hints = _hints(session)
    for a in allocations:
        if a.subnet_id in hints:
            subnet = session.get(m.Subnet, a.subnet_id)
            index = int(ipaddress.IPv4Address(a.ip_address)) - int(subnet.prefix.network_address) - 1
            hints[a.subnet_id] = max(0, min(hints[a.subnet_id], index))


# whether an address is allocated in a network; the window's addresses already allocated (each
# statement built once)
_IP_USED = select(m.IpAllocation.id).where(m.IpAllocation.network_id == bindparam("network_id"),
                                           m.IpAllocation.ip_address == bindparam("ip"))
_USED_IN_WINDOW = select(m.IpAllocation.ip_address).where(
    m.IpAllocation.network_id == bindparam("network_id"),
    m.IpAllocation.ip_address.in_(bindparam("window", expanding=True)))


_CLAIM_FIRST_FREE = text(_FIRST_FREE)


def _allocate_claimed(session: Session, network: NetworkRef, subnet: SubnetRef, first: int, last: int,
                      start: int, taken: set[str]) -> int | None:
    """PostgreSQL: the lowest free host address from `start` on that no other transaction holds, in
    one statement per ALLOCATION_WINDOW candidates (_CLAIM_FIRST_FREE), or None. One statement reads
    with the snapshot of its start: a holder whose commit falls between that and the lock is not
    seen, and the address's unique constraint refuses the second insert
    (fathom.api.deps.Store.write runs the request again)."""
    skip = [int(ipaddress.IPv4Address(a)) for a in taken]
    if subnet.gateway_ip:
        skip.append(int(ipaddress.IPv4Address(subnet.gateway_ip)))
    conn = session.connection()
    for low in range(start, last + 1, ALLOCATION_WINDOW):
        found = conn.scalar(_CLAIM_FIRST_FREE, {"low": low, "high": min(low + ALLOCATION_WINDOW - 1, last),
                                                "skip": skip, "network_id": network.id,
                                                "key_base": network.id << 32})
        if found is not None:
            return found
    return None


def _allocate_ip(session: Session, network: NetworkRef, subnet: SubnetRef, field: str,
                 taken: set[str] = frozenset()):
    """The lowest free host address of the subnet (the gateway's excluded) that no other transaction
    holds, checked ALLOCATION_WINDOW candidates per query from the subnet's hint on. PostgreSQL: held
    by an advisory lock (_allocate_claimed); SQLite serialises writers, and this process's
    reservations keep an address from the transactions that read alongside."""
    prefix = subnet.prefix
    first, last = int(prefix.network_address) + 1, int(prefix.broadcast_address) - 1
    hints = _hints(session)
    start = first + hints.get(subnet.id, 0)
    if session.get_bind().dialect.name == "postgresql":
        found = _allocate_claimed(session, network, subnet, first, last, start, taken)
        if found is not None:
            hints[subnet.id] = found - first
            return ipaddress.IPv4Address(found)
        if start > first:   # the hint was stale (addresses freed elsewhere): search the whole subnet once
            hints[subnet.id] = 0
            return _allocate_ip(session, network, subnet, field, taken)
        raise Conflict(f"subnet {subnet.id} ({subnet.cidr}) has no free address", field)
    reservations, allocation = _reservations_of(session), object()
    try:
        for low in range(start, last + 1, ALLOCATION_WINDOW):
            window = [str(ipaddress.IPv4Address(a)) for a in range(low, min(low + ALLOCATION_WINDOW, last + 1))]
            reservations.start(allocation)
            used = set(session.connection().scalars(_USED_IN_WINDOW,
                                                    {"network_id": network.id, "window": window})) | taken
            if subnet.gateway_ip:
                used.add(subnet.gateway_ip)
            for candidate in window:
                if candidate not in used and reservations.reserve(allocation, network.id, candidate):
                    _hold(session, network.id, candidate)
                    host = ipaddress.IPv4Address(candidate)
                    hints[subnet.id] = int(host) - first
                    return host
    finally:
        reservations.finish(allocation)
    if start > first:   # the hint was stale (addresses freed elsewhere): search the whole subnet once
        hints[subnet.id] = 0
        return _allocate_ip(session, network, subnet, field, taken)
    raise Conflict(f"subnet {subnet.id} ({subnet.cidr}) has no free address", field)


def update_port(session: Session, caller: Caller, port_id: int, changes: dict) -> m.Port:
    port = get(session, caller, m.Port, port_id)
    if port.router_id is not None:
        raise Conflict(f"port {port.id} is an interface of router {port.router_id}")
    _check_not_an_address_port(session, port)
    for field in ("node", "interface_name"):
        if field in changes and not caller.may_bind:   # unbinding (null) is binding too
            raise Forbidden(f"only an admin or the service identity can set a port's {field}", field)
    check_binding(caller, changes.get("node"), changes.get("interface_name"))
    before = port.node_id
    if "node" in changes:
        node = changes.pop("node")
        port.node_id = node_by_name(session, node).id if node is not None else None
    for key, value in changes.items():
        setattr(port, key, value)
    if port.node_id is not None and port.interface_name is not None:
        _check_interface_free(session, session.get(m.Node, port.node_id), port.interface_name, port.id)
    port.status = "pending"
    session.flush()
    _port_at(session, port.id, before, port.node_id, port.network_id)
    return port


def _port_at(session: Session, port_id: int, before: int | None, after: int | None, network_id: int) -> None:
    """Where a port written by this transaction was and is (changes.port_written)."""
    changes.port_written(session.connection(), port_id, before, after, network_id)


def _check_not_an_address_port(session: Session, port: m.Port) -> None:
    """A port holding a router gateway's or floating IP's address goes with that object only."""
    if session.scalar(select(RouterGateway.router_id).where(RouterGateway.address_port_id == port.id)) is not None:
        raise Conflict(f"port {port.id} holds a router's external gateway address: clear the router's "
                       "external_gateway instead")
    fip = session.scalar(select(FloatingIp.id).where(FloatingIp.address_port_id == port.id))
    if fip is not None:
        raise Conflict(f"port {port.id} holds the address of floating IP {fip}: delete the floating IP instead")


def delete_port(session: Session, caller: Caller, port_id: int) -> None:
    port = get(session, caller, m.Port, port_id)
    if port.router_id is not None:
        raise Conflict(f"port {port.id} is an interface of router {port.router_id}: "
                       f"remove it with DELETE /v1/routers/{port.router_id}/interfaces/{port.id}")
    _check_not_an_address_port(session, port)
    _freed(session, port.fixed_ips)
    session.delete(port)
    session.flush()
    _port_at(session, port.id, port.node_id, None, port.network_id)


# ---------------------------------------------------------------------------------------------- routers


def create_router(session: Session, caller: Caller, *, name: str = "",
                  project_id: str | None = None, external_id: str | None = None) -> m.Router:
    router = m.Router(name=name, project_id=_owner(caller, project_id), status="pending",
                      external_id=_external_id(session, caller, m.Router, external_id))
    session.add(router)
    session.flush()
    return router


def router_interfaces(session: Session, router_id: int) -> list[m.Port]:
    return list(session.scalars(select(m.Port).where(m.Port.router_id == router_id).order_by(m.Port.id)))


def delete_router(session: Session, caller: Caller, router_id: int) -> None:
    router = get(session, caller, m.Router, router_id)
    if session.get(RouterGateway, router.id) is not None:
        raise Conflict(f"router {router.id} has an external gateway: clear it first "
                       f"(PATCH /v1/routers/{router.id} with external_gateway null)")
    interfaces = router_interfaces(session, router.id)
    if interfaces:
        raise Conflict(f"router {router.id} still has interfaces on subnet(s) "
                       f"{sorted(a.subnet_id for p in interfaces for a in p.fixed_ips)}")
    session.delete(router)
    session.flush()


def add_router_interface(session: Session, caller: Caller, router_id: int, *, subnet_id: int,
                         ip_address: ipaddress.IPv4Address | None = None,
                         external_id: str | None = None, mac_address: str | None = None) -> m.Port:
    """An interface of the router on a subnet: a port of the subnet's network holding the gateway address."""
    router = get(session, caller, m.Router, router_id)
    subnet = get(session, caller, m.Subnet, subnet_id, "subnet_id")
    fabric.check_interface_mode(session, router, session.get(m.Network, subnet.network_id))
    for interface in router_interfaces(session, router.id):
        for alloc in interface.fixed_ips:
            other = session.get(m.Subnet, alloc.subnet_id)
            if other.id == subnet.id:
                raise Conflict(f"router {router.id} already has an interface on subnet {subnet.id}",
                               "subnet_id")
            if other.prefix_overlaps(subnet.prefix):
                raise Conflict(f"subnet {subnet.id} ({subnet.cidr}) overlaps subnet {other.id} "
                               f"({other.cidr}) already on router {router.id}", "subnet_id")
    if ip_address is None:
        if subnet.gateway_ip is None:
            raise Invalid(f"subnet {subnet.id} has no gateway_ip: give ip_address", "ip_address")
        ip_address = ipaddress.IPv4Address(subnet.gateway_ip)
    try:
        return create_port(session, caller, network_id=subnet.network_id, name=f"router-{router.id}",
                           mac_address=mac_address,
                           fixed_ips=[{"subnet_id": subnet.id, "ip_address": ip_address}],
                           project_id=router.project_id, router_id=router.id, port_security=False,
                           external_id=external_id)
    except (Invalid, Conflict) as e:
        # The port's own field names mean nothing to this request: report them as ip_address.
        if e.field and e.field.startswith("fixed_ips"):
            e.field = "ip_address"
        raise


def remove_router_interface(session: Session, caller: Caller, router_id: int, *, interface_id: int | None = None,
                            subnet_id: int | None = None) -> None:
    """Remove the router's interface whose id (its port's) is `interface_id`, or the one on `subnet_id`."""
    router = get(session, caller, m.Router, router_id)
    field = "subnet_id" if interface_id is None else "interface_id"   # what the caller named it by
    found = [p for p in router_interfaces(session, router.id)
             if p.id == interface_id or (interface_id is None and any(a.subnet_id == subnet_id for a in p.fixed_ips))]
    if not found:
        raise NotFound(f"router {router.id} has no interface on subnet {subnet_id}" if interface_id is None
                       else f"router {router.id} has no interface {interface_id} (its id is its port's)", field)
    interface = found[0]
    fips = [f for f in session.scalars(select(FloatingIp).where(FloatingIp.router_id == router.id)) if f.fixed_ip]
    for a in interface.fixed_ips:
        prefix = session.get(m.Subnet, a.subnet_id).prefix
        using = sorted(f.id for f in fips if ipaddress.IPv4Address(f.fixed_ip) in prefix)
        if using:
            raise Conflict(f"floating IP(s) {using} reach ports of subnet {a.subnet_id} through interface "
                           f"{interface.id}: disassociate them first", field)
    _freed(session, interface.fixed_ips)
    session.delete(interface)
    session.flush()
