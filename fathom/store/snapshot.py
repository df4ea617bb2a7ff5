"""The store builds the model: `load_snapshot(session)` reads every table in one transaction into a
fathom.model.Snapshot, the only input of the compilers."""
from __future__ import annotations

import functools
from collections import namedtuple
from collections.abc import Collection

from sqlalchemy import Integer, and_, bindparam, cast, func, or_, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY

from fathom.model.taps import TAP_VNI_BASE
from fathom.model.flow_records import FlowSampling
from fathom.model import (
    ChainPptmon, FixedIp, FloatingIp, FlowClassifier, Network, Node, Port, PortChain, PortPair, PortPairGroup,
    Router, RouterGateway, RouterInterface, SecurityGroup, SecurityGroupRule, Snapshot, Subnet, TapPolicy,
)
from fathom.store import models as m
from fathom.store import sfc_models as sm
from fathom.store.agent_models import NodeAgent
from fathom.store.agents import recommended_datapath
from fathom.store.external_models import FloatingIp as FloatingIpRow
from fathom.store.external_models import RouterGateway as RouterGatewayRow
from fathom.store.db import READ_ONLY, driver_sql, run_prepared
from fathom.store.fabric import load_fabric
from fathom.store.fabric_models import FabricSwitch
from fathom.store.flow_records_models import FlowSampling as FlowSamplingRow
from fathom.store.status import dhcp_status_value


def load_snapshot(session, statuses: dict | None = None) -> Snapshot:
    """Read the whole store into a Snapshot, consistently (one transaction; reads only).

    Call with a fresh Session: `with Session(engine) as s: snap = load_snapshot(s)`. With
    `statuses`, the stored (status, reason) of every object is put there too, keyed like
    fathom.controller.status.decide's answer ((kind, id); nodes also ("node_state", id)), so the
    reconciler writes only the statuses that differ.
    """
    return StoreReader().read(session, statuses)


def load_tap_view(session, routes: bool = False, policies: Collection[int] | None = None) -> Snapshot:
    """What the tap policies' checks from the store alone read (fathom.apps.vtap.static_problems):
    the nodes, the policies, the ports they name, their networks and those whose VNI is in the
    tap markers' space, not the whole store (an API call on one policy must not read every port or
    network of the cloud); `routes`: also the routers' interfaces and the subnets of all these
    networks, which tell how a policy's traffic is routed (its overlap with another's,
    fathom.model.taps.conflicting_policies); `policies`: only the policies of these ids (a
    policy's problems are its own). In the caller's transaction."""
    seen: dict = {}
    parts = {"nodes": _nodes(session, seen, {})}
    taps = _taps(session, seen, parts, where=None if policies is None else m.TapPolicy.id.in_(list(policies)))["taps"]
    ids = {i for t in taps for i in (t.sender_port_id, t.receiver_port_id, *t.monitor_port_ids) if i is not None}
    if routes:
        ids |= set(session.scalars(_ROUTER_PORT_IDS))
    rows, _ = _port_rows(session, seen, parts["nodes"]["names"], _address_port_ids(session), ids)
    listed = [(kind, value) for _id, (kind, value, _addresses) in sorted(rows.items())]
    ports = tuple(value for kind, value in listed if kind == "port")
    interfaces = tuple(value for kind, value in listed if kind == "interface" and value is not None)
    network_ids = list({x.network_id for x in (*ports, *interfaces)})
    t = m.Network
    networks = _networks(session, seen, parts, where=or_(
        t.id.in_(network_ids), and_(t.type == "vxlan", t.segmentation_id >= TAP_VNI_BASE)))["networks"]
    subnets = _subnets(session, seen, parts, where=m.Subnet.network_id.in_(network_ids))["subnets"] if routes else ()
    return Snapshot(parts["nodes"]["nodes"], networks, subnets, ports=ports, router_interfaces=interfaces,
                    tap_policies=taps)


# The store read in parts: part -> (the tables it reads, the parts whose result it uses). A part is
# read again when one of its tables was written or a part it uses was read again.
PARTS: dict[str, tuple[frozenset, tuple[str, ...]]] = {
    "nodes": (frozenset({"nodes", "node_agents"}), ()),
    "networks": (frozenset({"networks"}), ()),
    "subnets": (frozenset({"subnets"}), ()),
    "ports": (frozenset({"ports", "ip_allocations", "port_security_groups", "router_gateways", "floating_ips"}),
              ("nodes",)),
    "routers": (frozenset({"routers"}), ()),
    "taps": (frozenset({"tap_policies"}), ()),
    "secgroups": (frozenset({"security_groups", "security_group_rules"}), ()),
    "gateways": (frozenset({"router_gateways"}), ("nodes", "ports")),
    "floating_ips": (frozenset({"floating_ips"}), ()),
    "fabric": (frozenset({"nodes", "fabric_switches", "fabric_links", "router_modes"}), ()),
    "chains": (frozenset({"sfc_port_chains", "sfc_port_pair_groups", "sfc_port_pairs", "sfc_flow_classifiers"}),
               ()),
    "flow_sampling": (frozenset({"flow_sampling"}), ()),
}


# The parts whose rows name ports that a port's delete changes (ON DELETE SET NULL or CASCADE):
# part -> the ports its kept rows name.
PORTS_NAMED = {
    "taps": lambda part: {i for t in part["taps"] for i in (t.sender_port_id, t.receiver_port_id, *t.monitor_port_ids)},
    "floating_ips": lambda part: {f.port_id for f in part["fips"]},
    "flow_sampling": lambda part: {r.port_id for r in part["rows"]},
}


class StoreReader:
    """Reads the store into a Snapshot, keeping each part's result: `read(session, statuses,
    written)` reads again only the parts whose tables are in `written` (fathom.store.changes; None:
    every part) and reuses the others. Row tokens of ports in `written` patch the kept ports part:
    those ports are read again by id (at most PATCH_LIMIT, else the part is read whole). The stored
    statuses of the parts not read again are those of their last read, updated by
    `statuses_written`."""

    PATCH_LIMIT = 200

    def __init__(self):
        self.parts: dict[str, dict] = {}            # part -> its fields of the Snapshot (and helpers)
        self.statuses: dict[str, dict] = {}         # part -> stored statuses read with it
        self.reads: dict[str, int] = {}             # part -> times read whole (what a change cost)
        self.patches: dict[str, int] = {}           # part -> times patched by row
        self.rows_read = 0                          # ports read again by id

    def due(self, written: set | None, patched: frozenset = frozenset()) -> list[str]:
        """The parts to read again for these written tables, in dependency order (a part in
        `patched` counts as read again for the parts using it). A port delete's cascade to a
        table counts for a part that keeps rows naming ports (PORTS_NAMED) only when one of them
        names a port the writes name: it changes no other row (the rows a write made before it
        named a port are read again by then, or with it: their tables are written too)."""
        from fathom.store.changes import ALL
        names = {w for w in written if isinstance(w, str)} if written is not None else set()
        cascades = {w[1] for w in written or () if isinstance(w, tuple) and w[0] == "port_cascade"}
        ports = {w[1] for w in written or () if isinstance(w, tuple) and w[0] == "port" and w[1] is not None}
        out: list[str] = []
        for name, (tables, uses) in PARTS.items():
            if name == "ports":
                counted = names             # the cascades are its own rows (fathom.store.changes)
            elif cascades and name in PORTS_NAMED and name in self.parts \
                    and not PORTS_NAMED[name](self.parts[name]) & ports:
                counted = names
            else:
                counted = names | cascades
            if (written is None or ALL in names or name not in self.parts or tables & counted
                    or any(u in out or u in patched for u in uses)):
                out.append(name)
        return out

    def read(self, session, statuses: dict | None = None, written: set | None = None) -> Snapshot:
        def run():
            due = self.due(written)
            rows = {w for w in written or () if isinstance(w, tuple) and w[0] in ("port", "ip_allocation")}
            if rows and "ports" not in due:
                patched = self._patch_ports(session, rows)
                if patched is not None:
                    self.patches["ports"] = self.patches.get("ports", 0) + 1
                    due = self.due(written, patched)
                else:
                    due = self.due(written | {"ports"})
            for name in due:
                seen: dict = {}
                self.parts[name] = _READERS[name](session, seen, self.parts)
                self.statuses[name] = seen
                self.reads[name] = self.reads.get(name, 0) + 1
            if statuses is not None:
                for seen in self.statuses.values():
                    statuses.update(seen)
            p = self.parts
            return Snapshot(p["nodes"]["nodes"], p["networks"]["networks"], p["subnets"]["subnets"],
                            p["ports"]["ports"], p["routers"]["routers"], p["ports"]["interfaces"],
                            tap_policies=p["taps"]["taps"], security_groups=p["secgroups"]["groups"],
                            security_group_rules=p["secgroups"]["rules"], router_gateways=p["gateways"]["gateways"],
                            floating_ips=p["floating_ips"]["fips"], fabric=p["fabric"]["fabric"],
                            flow_sampling=p["flow_sampling"]["rows"], **p["chains"])

        if session.in_transaction():
            return run()
        with session.begin():
            options = dict(READ_ONLY)
            if session.get_bind().dialect.name == "postgresql":
                # Several SELECTs must see one state: READ COMMITTED (the default) would not. One
                # SELECT sees one state by itself, and runs outside a transaction: no BEGIN and
                # ROLLBACK round trips (the read of a port another process wrote, every replica's).
                options["isolation_level"] = "AUTOCOMMIT" if self._one_statement(written) else "REPEATABLE READ"
            session.connection(execution_options=options)
            return run()

    def _one_statement(self, written: set | None) -> bool:
        """Whether reading `written` is one SELECT: no part read again, only the rows of ports
        known by id (a patch), none of which holds a router gateway's or floating IP's address
        (those the gateways part reads too)."""
        rows = {w for w in written or () if isinstance(w, tuple) and w[0] in ("port", "ip_allocation")}
        if written is None or not rows or ("port", None) in rows or self.due(written):
            return False
        ids = self._patch_ids(rows)
        return len(ids) <= self.PATCH_LIMIT and not ids & self.parts["ports"]["address_port_ids"]

    def _patch_ids(self, rows: set) -> set:
        """The ports these row tokens name (an inserted port, `("port", None)`, not among them). An
        address row this part does not know was inserted since the last read (every address row
        has a port, and the part holds every row it read): its INSERT named its port among these
        tokens (fathom.store.changes), or counted as its table and the part is read whole, so it
        adds no port (a port created and deleted between two reads: its address rows too)."""
        owners = self.parts["ports"]["allocation_ports"]
        ids = set()
        for kind, key in rows:
            if kind == "ip_allocation":
                port_id = owners.get(key)
                if port_id is not None:
                    ids.add(port_id)
            elif key is not None:
                ids.add(key)
        return ids

    def _patch_ports(self, session, rows: set) -> frozenset | None:
        """Read again the ports these row tokens name into the kept ports part; None (nothing
        changed) when they are too many. Returns the parts that count as read again for those
        using them: the ports part where one of the ports holds a router gateway's or floating
        IP's address (the gateways part reads those), else none."""
        part, seen = self.parts["ports"], self.statuses["ports"]
        kept, owners = part["rows"], part["allocation_ports"]
        ids = self._patch_ids(rows)
        if ("port", None) in rows:          # inserted ports: the ids not kept yet
            ids |= set(session.connection().execute(_PORT_IDS).scalars()) - kept.keys()
        if len(ids) > self.PATCH_LIMIT:
            return None
        olds = {}
        for port_id in ids:
            old = kept.pop(port_id, None)
            if old is not None:
                olds[port_id] = old
                for allocation_id in old[2]:
                    del owners[allocation_id]
            seen.pop(("port", port_id), None)
            seen.pop(("router_interface", port_id), None)
        new, new_owners = _port_rows(session, seen, self.parts["nodes"]["names"], part["address_port_ids"], ids)
        # the reconciler passes the tokens of the read before again (changes it may have missed): a
        # port read again as it was keeps its row, and when the others are new ports above every
        # kept one (a burst of creations) the part's lists are extended by them (_ports_part)
        for port_id, old in olds.items():
            if new.get(port_id) == old:
                new[port_id] = old
        added = {i: row for i, row in new.items() if i not in olds}
        extended = all(new.get(i) is old for i, old in olds.items()) and all(i > part["top"] for i in added)
        kept.update(new)
        owners.update(new_owners)
        self.parts["ports"] = _ports_part(kept, owners, part["address_port_ids"], *((part, added) if extended else ()))
        self.rows_read += len(ids)
        return frozenset({"ports"}) if ids & part["address_port_ids"] else frozenset()

    def statuses_written(self, written: dict) -> None:
        """The reconciler wrote these statuses ((kind, id) -> (status, reason); ("node_state", name)
        -> state): the kept stored statuses say so too."""
        for seen in self.statuses.values():
            for key in written.keys() & seen.keys():
                seen[key] = written[key]


def _nodes(session, seen, _parts) -> dict:
    node_names, nodes = {}, []
    reported = {a.node_id: recommended_datapath(a.facts or {}) for a in session.scalars(select(NodeAgent))}
    for n in session.scalars(select(m.Node).order_by(m.Node.id)):
        node_names[n.id] = n.name
        seen[("node", n.id)] = (n.status, n.status_reason)
        seen[("node_state", n.name)] = n.state
        nodes.append(Node(n.id, n.name, n.role, n.tunnel_ip, n.management_ip, n.state,
                          datapath_type=n.datapath_type or reported.get(n.id)))
    return {"nodes": tuple(nodes), "names": node_names}


def _where(query, where):
    """`query` with the condition `where` (None: all rows)."""
    return query if where is None else query.where(where)


def _networks(session, seen, _parts, where=None) -> dict:
    networks = []
    for n in session.scalars(_where(select(m.Network), where).order_by(m.Network.id)):
        seen[("network", n.id)] = (n.status, n.status_reason)
        networks.append(Network(n.id, n.name, n.project_id, n.type, n.segmentation_id, n.external, n.upstream_mac))
    return {"networks": tuple(networks)}


def _subnets(session, seen, _parts, where=None) -> dict:
    subnets = []
    for s in session.scalars(_where(select(m.Subnet), where).order_by(m.Subnet.id)):
        seen[("subnet", s.id)] = (s.status, s.status_reason)
        seen[("subnet_dhcp", s.id)] = dhcp_status_value(s.dhcp_status)
        subnets.append(Subnet(s.id, s.name, s.project_id, s.network_id, s.cidr, s.gateway_ip,
                              bool(s.enable_dhcp), tuple(s.dns_nameservers or ()),
                              tuple((r["destination"], r["nexthop"]) for r in s.host_routes or ())))
    return {"subnets": tuple(subnets)}


def _ports(session, seen, parts) -> dict:
    address_port_ids = _address_port_ids(session)
    rows, owners = _port_rows(session, seen, parts["nodes"]["names"], address_port_ids, None)
    return _ports_part(rows, owners, address_port_ids)


def _address_port_ids(session) -> frozenset:
    """The ports that hold a router gateway's or a floating IP's address (not workloads)."""
    return frozenset(session.scalars(select(RouterGatewayRow.address_port_id))) | \
        frozenset(session.scalars(select(FloatingIpRow.address_port_id)))


def _port_rows(session, seen, node_names, address_port_ids, ids) -> tuple[dict, dict]:
    """The ports with these ids (None: all) as port id -> (kind, its model object, its address
    rows' ids), kind "port", "interface" (a router interface; None without an address) or
    "address" (holds a router gateway's or floating IP's address: (mac, fixed IPs), not a
    workload); and address row id -> port id."""
    if ids is not None and not ids:
        return {}, {}
    conn = session.connection()
    if ids is None:
        allocations_q, memberships_q, ports_q = _port_queries()
        allocation_rows, membership_rows, port_rows = (conn.execute(allocations_q), conn.execute(memberships_q),
                                                       conn.execute(ports_q))
    elif conn.dialect.name == "postgresql" and len(ids) >= DRIVER_READ_MIN:
        allocation_rows, membership_rows, port_rows = _joined(
            map(_ByIdRow._make, run_prepared(conn, _ports_by_id_sql(), {"ids": list(ids)}, plan_kept=False)))
    else:
        allocation_rows, membership_rows, port_rows = _joined(conn.execute(_ports_by_id(), {"ids": list(ids)}))
    owners: dict[int, int] = {}
    allocations: dict[int, list[FixedIp]] = {}
    allocation_ids: dict[int, list[int]] = {}
    for allocation_id, port_id, subnet_id, address in allocation_rows:
        owners[allocation_id] = port_id
        allocations.setdefault(port_id, []).append(FixedIp(subnet_id, address))
        allocation_ids.setdefault(port_id, []).append(allocation_id)
    memberships: dict[int, list[int]] = {}
    for port_id, group_id in membership_rows:
        memberships.setdefault(port_id, []).append(group_id)
    rows = {}
    for p in port_rows:
        fixed = tuple(allocations.get(p.id, ()))
        mine = tuple(allocation_ids.get(p.id, ()))
        seen[("router_interface" if p.router_id is not None else "port", p.id)] = (p.status, p.status_reason)
        if p.id in address_port_ids:
            rows[p.id] = ("address", (p.mac_address, fixed), mine)
        elif p.router_id is not None:
            rows[p.id] = ("interface", next((RouterInterface(p.id, p.router_id, f.subnet_id, p.network_id,
                                                             f.ip_address, p.mac_address) for f in fixed), None), mine)
        else:
            rows[p.id] = ("port", Port(p.id, p.name, p.project_id, p.network_id, p.mac_address, fixed,
                                       node_names.get(p.node_id), p.interface_name, p.port_security,
                                       tuple(memberships.get(p.id, ()))), mine)
    return rows, owners


_PORT_COLUMNS = ("id", "name", "project_id", "network_id", "mac_address", "node_id", "interface_name",
                 "port_security", "router_id", "status", "status_reason")


@functools.cache
def _port_queries() -> tuple:
    """The reads of every port's rows (addresses, security group memberships, the ports), built
    once: plain rows, not ORM objects (a whole read reads every port)."""
    a, sg, t = m.IpAllocation.__table__.c, m.PortSecurityGroup.__table__.c, m.Port.__table__.c
    return (select(a.id, a.port_id, a.subnet_id, a.ip_address).order_by(a.id),
            select(sg.port_id, sg.group_id).order_by(sg.port_id, sg.group_id),
            select(*(t[c] for c in _PORT_COLUMNS)).order_by(t.id))


def _ports_joined(ports, where=None):
    """The rows of the ports of `ports` (the ports table, or it joined with what picks them) where
    `where`: each port joined with its addresses and its memberships (a row per address and group),
    in port, address and group order (see _joined)."""
    a_table, sg_table, t_table = m.IpAllocation.__table__, m.PortSecurityGroup.__table__, m.Port.__table__
    a, sg, t = a_table.c, sg_table.c, t_table.c
    statement = (select(*(t[c] for c in _PORT_COLUMNS), a.id.label("allocation_id"), a.subnet_id, a.ip_address,
                        sg.group_id)
                 .select_from(ports.outerjoin(a_table, a.port_id == t.id).outerjoin(sg_table, sg.port_id == t.id))
                 .order_by(t.id, a.id, sg.group_id))
    return statement.where(where) if where is not None else statement


@functools.cache
def _ports_by_id():
    """The rows of the ports whose ids are the parameter `ids` in one SELECT (one round trip)."""
    t = m.Port.__table__
    return _ports_joined(t, t.c.id.in_(bindparam("ids", expanding=True)))


@functools.cache
def _ports_by_id_sql() -> str:
    """_ports_by_id as PostgreSQL's driver runs it (run_prepared), the ids as one array joined to the
    ports: one statement, parsed once a connection, for any number of them (SQLAlchemy's expanding IN
    is a statement of its own, parsed and planned, for each count). Planned for each array, not kept
    (run_prepared's `plan_kept`): a generic plan made while the tables were small joins them by a
    scan of each, which then grows with them until their next ANALYZE."""
    t = m.Port.__table__
    ids = func.unnest(cast(bindparam("ids"), ARRAY(Integer))).table_valued("id").render_derived(name="wanted")
    return driver_sql(_ports_joined(ids.join(t, t.c.id == ids.c.id)), postgresql.psycopg.dialect())[0]


# From this many ports a read by id runs _ports_by_id_sql: for fewer, SQLAlchemy's statement of that
# count is prepared by psycopg and its plan kept, which costs PostgreSQL less than a plan each time
# (steps/read-by-id/ in docs/benchmarks/scale/api-postgresql).
DRIVER_READ_MIN = 3


# a row of _ports_by_id_sql, its columns by name as SQLAlchemy's rows give them
_ByIdRow = namedtuple("_ByIdRow", (*_PORT_COLUMNS, "allocation_id", "subnet_id", "ip_address", "group_id"))


def _joined(result) -> tuple[list, list, list]:
    """The rows of _ports_by_id as those of _port_queries' three reads: addresses (id, port id,
    subnet id, address) in id order, memberships (port id, group id) in group order, ports."""
    allocations, memberships, ports = {}, {}, {}
    for r in result:
        ports.setdefault(r.id, r)
        if r.allocation_id is not None:
            allocations.setdefault(r.allocation_id, (r.allocation_id, r.id, r.subnet_id, r.ip_address))
        if r.group_id is not None:
            memberships.setdefault((r.id, r.group_id), (r.id, r.group_id))
    return list(allocations.values()), list(memberships.values()), list(ports.values())


_PORT_IDS = select(m.Port.__table__.c.id)
_ROUTER_PORT_IDS = select(m.Port.__table__.c.id).where(m.Port.__table__.c.router_id.is_not(None))


def _ports_part(rows: dict, owners: dict, address_port_ids: frozenset,
                before: dict | None = None, added: dict | None = None) -> dict:
    """The ports part from its rows (see _port_rows), in port id order. `before` and `added`: the
    part before a patch that only added rows (`added`, port id -> row), each above every port id
    of `before`: its lists are extended by them, not built again from every row (a burst of
    creations patches the part each pass)."""
    ports, interfaces, address_ports = [], [], {}
    for port_id in sorted(rows if before is None else added):
        kind, value, _ = rows[port_id]
        if kind == "port":
            ports.append(value)
        elif kind == "address":
            address_ports[port_id] = value
        elif value is not None:
            interfaces.append(value)
    top = max(rows, default=0) if before is None else max(added, default=before["top"])
    if before is not None:
        ports, interfaces = before["ports"] + tuple(ports), before["interfaces"] + tuple(interfaces)
        address_ports = {**before["address_ports"], **address_ports} if address_ports else before["address_ports"]
    return {"ports": tuple(ports), "interfaces": tuple(interfaces), "address_ports": address_ports,
            "rows": rows, "allocation_ports": owners,
            "address_port_ids": address_port_ids, "top": top}


def _routers(session, seen, _parts) -> dict:
    routers = []
    for r in session.scalars(select(m.Router).order_by(m.Router.id)):
        seen[("router", r.id)] = (r.status, r.status_reason)
        routers.append(Router(r.id, r.name, r.project_id))
    return {"routers": tuple(routers)}


def _taps(session, seen, _parts, where=None) -> dict:
    taps = []
    for t in session.scalars(_where(select(m.TapPolicy), where).order_by(m.TapPolicy.id)):
        seen[("tap_policy", t.id)] = (t.status, t.status_reason)
        taps.append(TapPolicy(t.id, t.name, t.project_id, t.sender_port_id, t.receiver_port_id,
                              t.receiver_is_port, t.receiver_mac, t.receiver_ip,
                              (t.monitor_port_id,) + ((t.monitor2_port_id,) if t.has_monitor2 else ()),
                              t.direction, t.priority, tuple(sorted((t.filters or {}).items())),
                              t.truncate, t.rate_pps, t.sender_is_port))
    return {"taps": tuple(taps)}


def _secgroups(session, seen, _parts) -> dict:
    rows = list(session.scalars(select(m.SecurityGroup).order_by(m.SecurityGroup.id)))
    for g in rows:
        seen[("security_group", g.id)] = (g.status, g.status_reason)
    groups = tuple(SecurityGroup(g.id, g.name, g.project_id) for g in rows)
    rules = tuple(SecurityGroupRule(r.id, r.group_id, r.direction, r.ethertype, r.protocol, r.port_range_min,
                                    r.port_range_max, r.remote_ip_prefix, r.remote_group_id)
                  for r in session.scalars(select(m.SecurityGroupRule).order_by(m.SecurityGroupRule.id)))
    return {"groups": groups, "rules": rules}


def _flow_sampling(session, _seen, _parts) -> dict:
    rows = session.scalars(select(FlowSamplingRow).order_by(FlowSamplingRow.id))
    return {"rows": tuple(FlowSampling(r.id, r.project_id, r.port_id, r.ingress, r.admit, r.drop) for r in rows)}


def _gateways(session, _seen, parts) -> dict:
    node_names, address_ports = parts["nodes"]["names"], parts["ports"]["address_ports"]
    gateways = []
    for g in session.scalars(select(RouterGatewayRow).order_by(RouterGatewayRow.router_id)):
        mac, fixed = address_ports[g.address_port_id]
        gateways.append(RouterGateway(g.router_id, g.network_id, fixed[0].subnet_id, fixed[0].ip_address,
                                      mac, node_names.get(g.node_id), g.ct_zone, g.snat, g.address_port_id))
    return {"gateways": tuple(gateways)}


def _floating_ips(session, seen, _parts) -> dict:
    fips = []
    for f in session.scalars(select(FloatingIpRow).order_by(FloatingIpRow.id)):
        seen[("floating_ip", f.id)] = (f.status, f.status_reason)
        fips.append(FloatingIp(f.id, f.project_id, f.network_id, f.ip_address, f.ct_zone, f.port_id,
                               f.fixed_ip if f.port_id is not None else None,
                               f.router_id if f.port_id is not None else None, f.address_port_id))
    return {"fips": tuple(fips)}


def _fabric(session, seen, _parts) -> dict:
    for sw in session.execute(select(FabricSwitch.id, FabricSwitch.status, FabricSwitch.status_reason)):
        seen[("fabric_switch", sw.id)] = (sw.status, sw.status_reason)
    return {"fabric": load_fabric(session)}


_READERS = {"nodes": _nodes, "networks": _networks, "subnets": _subnets, "ports": _ports, "routers": _routers,
            "taps": _taps, "secgroups": _secgroups, "gateways": _gateways, "floating_ips": _floating_ips,
            "fabric": _fabric, "chains": lambda session, seen, _parts: _chains(session, seen),
            "flow_sampling": _flow_sampling}


def _range(low, high) -> tuple[int, int] | None:
    return None if low is None else (low, high)


def _chains(session, seen: dict) -> dict:
    """Port pairs, groups (members in id order), flow classifiers and chains (groups in order)."""
    pairs = list(session.scalars(select(sm.PortPair).order_by(sm.PortPair.id)))
    groups = list(session.scalars(select(sm.PortPairGroup).order_by(sm.PortPairGroup.id)))
    fcs = list(session.scalars(select(sm.FlowClassifier).order_by(sm.FlowClassifier.id)))
    chains = list(session.scalars(select(sm.PortChain).order_by(sm.PortChain.id)))
    for kind, rows in (("port_pair", pairs), ("port_pair_group", groups), ("flow_classifier", fcs),
                       ("port_chain", chains)):
        for row in rows:
            seen[(kind, row.id)] = (row.status, row.status_reason)
    return {
        "port_pairs": tuple(PortPair(p.id, p.name, p.project_id, p.ingress_port_id, p.egress_port_id) for p in pairs),
        "port_pair_groups": tuple(PortPairGroup(g.id, g.name, g.project_id,
                                                tuple(p.id for p in pairs if p.group_id == g.id)) for g in groups),
        "flow_classifiers": tuple(FlowClassifier(
            f.id, f.name, f.project_id, f.logical_source_port_id, f.logical_destination_port_id, f.protocol,
            f.source_ip_prefix, f.destination_ip_prefix, _range(f.source_port_range_min, f.source_port_range_max),
            _range(f.destination_port_range_min, f.destination_port_range_max)) for f in fcs),
        "port_chains": tuple(PortChain(
            c.id, c.name, c.project_id,
            tuple(g.id for g in sorted((g for g in groups if g.chain_id == c.id), key=lambda g: g.position)),
            tuple(f.id for f in fcs if f.chain_id == c.id), c.symmetric,
            ChainPptmon(int(c.pptmon["period_ns"])) if c.pptmon else None) for c in chains),
    }
