"""Store operations of security groups: groups, rules, ports' memberships, each project's default
group (made on first use, as Neutron does).

Like fathom/store/ops.py, each check raises a fathom.store.errors error naming the request field.
Groups, rules and memberships never cross projects: a port joins only groups of its own project and
a rule's remote group is of the rule's project, whoever asks (an admin too).
"""
from __future__ import annotations

import ipaddress

from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from fathom.store import models as m
from fathom.store.db import NeedsTransaction, at_once
from fathom.store.errors import Conflict, Invalid, NotFound
from fathom.store.ops import LOCK_DEFAULT_GROUP, Caller, _external_id, _owner, _serialise, keep, valid_id

DIRECTIONS = ("ingress", "egress")
ETHERTYPES = ("IPv4", "IPv6")
# Protocol names a rule may give, as Neutron spells them; numbers 0..255 are accepted too.
PROTOCOLS = {"tcp": 6, "udp": 17, "icmp": 1, "icmpv6": 58, "ipv6-icmp": 58, "sctp": 132, "gre": 47,
             "esp": 50, "ah": 51, "igmp": 2, "dccp": 33, "udplite": 136}
ANY = ("any", "")
PROTOCOL_NAMES = {6: "tcp", 17: "udp", 1: "icmp", 58: "ipv6-icmp", 132: "sctp"}
WITH_PORTS = (6, 17, 132)             # protocols whose rules may give a destination port range (OpenFlow matches these)
ICMP = (1, 58)                         # port_range_min / max are type / code
MAX_RULES_PER_GROUP = 1000
MAX_GROUPS_PER_PORT = 32
DEFAULT_NAME = "default"
# Neutron's default group: egress to anywhere, ingress from the group's members, IPv4 and IPv6.
DEFAULT_RULES = (("egress", "IPv4", False), ("egress", "IPv6", False), ("ingress", "IPv4", True),
                 ("ingress", "IPv6", True))


def _visible(caller: Caller, obj) -> bool:
    return caller.admin or obj.project_id == caller.project


def get_group(session: Session, caller: Caller, group_id: int, field: str | None = None) -> m.SecurityGroup:
    group = session.get(m.SecurityGroup, group_id) if valid_id(group_id) else None
    if group is None or not _visible(caller, group):
        raise NotFound(f"security group {group_id} does not exist", field)
    return group


def get_rule(session: Session, caller: Caller, rule_id: int) -> m.SecurityGroupRule:
    rule = session.get(m.SecurityGroupRule, rule_id) if valid_id(rule_id) else None
    if rule is None or not _visible(caller, rule):
        raise NotFound(f"security group rule {rule_id} does not exist")
    return rule


def default_group(session: Session, project: str) -> m.SecurityGroup:
    """The project's default group, made (with Neutron's four rules) if it has none yet."""
    row = session.get(m.DefaultSecurityGroup, project)
    if row is not None:   # the common case, with no lock: a default group is never replaced
        return session.get(m.SecurityGroup, row.group_id)
    _serialise(session, LOCK_DEFAULT_GROUP, 0)
    row = session.scalar(select(m.DefaultSecurityGroup).where(m.DefaultSecurityGroup.project_id == project)
                         .execution_options(populate_existing=True))
    if row is not None:
        return session.get(m.SecurityGroup, row.group_id)
    group = m.SecurityGroup(name=DEFAULT_NAME, description="Default security group", project_id=project,
                            status="pending")
    session.add(group)
    session.flush()
    session.add(m.DefaultSecurityGroup(project_id=project, group_id=group.id))
    for direction, ethertype, from_members in DEFAULT_RULES:
        session.add(m.SecurityGroupRule(project_id=project, group_id=group.id, direction=direction,
                                        ethertype=ethertype, remote_group_id=group.id if from_members else None))
    session.flush()
    return group


def is_default(session: Session, group: m.SecurityGroup) -> bool:
    row = session.get(m.DefaultSecurityGroup, group.project_id)
    return row is not None and row.group_id == group.id


def ensure_default(session: Session, caller: Caller) -> None:
    """First use of security groups by a (non-admin) project makes its default group, as listing
    groups does in Neutron."""
    if not caller.admin:
        default_group(session, caller.project)


# ---------------------------------------------------------------------------------------------- groups


def create_group(session: Session, caller: Caller, *, name: str, description: str = "",
                 project_id: str | None = None, external_id: str | None = None) -> m.SecurityGroup:
    project = _owner(caller, project_id)
    default_group(session, project)
    if name == DEFAULT_NAME:
        raise Conflict("every project has one group named 'default' (made on first use)", "name")
    group = m.SecurityGroup(name=name, description=description, project_id=project, status="pending",
                            external_id=_external_id(session, caller, m.SecurityGroup, external_id))
    session.add(group)
    session.flush()
    return group


def update_group(session: Session, caller: Caller, group_id: int, changes: dict) -> m.SecurityGroup:
    group = get_group(session, caller, group_id)
    if "name" in changes and changes["name"] != group.name:
        if is_default(session, group):
            raise Conflict("the default group cannot be renamed", "name")
        if changes["name"] == DEFAULT_NAME:
            raise Conflict("every project has one group named 'default'", "name")
    if "external_id" in changes and changes["external_id"] != group.external_id:
        changes = {**changes, "external_id": _external_id(session, caller, m.SecurityGroup, changes["external_id"])}
    for key, value in changes.items():
        setattr(group, key, value)
    session.flush()
    return group


def delete_group(session: Session, caller: Caller, group_id: int) -> None:
    group = get_group(session, caller, group_id)
    if is_default(session, group):
        raise Conflict("the default group of a project cannot be deleted")
    members = session.scalar(select(func.count()).select_from(m.PortSecurityGroup)
                             .where(m.PortSecurityGroup.group_id == group.id))
    if members:
        raise Conflict(f"security group {group.id} is in use by {members} port(s)")
    # rules of other groups naming this one as their remote go with it (the foreign key cascades)
    for rule in session.scalars(select(m.SecurityGroupRule).where(m.SecurityGroupRule.remote_group_id == group.id)):
        session.delete(rule)
    session.delete(group)
    session.flush()


# ---------------------------------------------------------------------------------------------- rules


def parse_protocol(value, ethertype: str) -> int | None:
    """A rule's protocol: None / "any" -> None, a name or a number 0..255 -> the number. "icmp"
    with IPv6 means ICMPv6, as in Neutron."""
    if value is None or (isinstance(value, str) and value.lower() in ANY):
        return None
    if isinstance(value, bool):
        raise Invalid("a protocol is a name (tcp, udp, icmp, ...) or a number 0..255", "protocol")
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int):
        if not 0 <= value <= 255:
            raise Invalid("an IP protocol number is 0..255", "protocol")
        number = value
    elif isinstance(value, str) and value.lower() in PROTOCOLS:
        number = PROTOCOLS[value.lower()]
    else:
        raise Invalid(f"unknown protocol {str(value)[:32]!r}: give tcp, udp, icmp, icmpv6, sctp, ... "
                      "or a number 0..255", "protocol")
    if number == 1 and ethertype == "IPv6":
        return 58
    if number == 58 and ethertype == "IPv4":
        raise Invalid("ICMPv6 is an IPv6 protocol: give ethertype IPv6", "protocol")
    return number


def _check_ports(protocol: int | None, low: int | None, high: int | None) -> tuple[int | None, int | None]:
    if low is None and high is None:
        return None, None
    if protocol in WITH_PORTS:
        if low is None:
            raise Invalid("give port_range_min with port_range_max", "port_range_min")
        high = low if high is None else high
        for field, v in (("port_range_min", low), ("port_range_max", high)):
            if not 1 <= v <= 65535:
                raise Invalid("a port is 1..65535", field)
        if low > high:
            raise Invalid("port_range_min must not exceed port_range_max", "port_range_min")
        return low, high
    if protocol in ICMP:
        if low is None:
            raise Invalid("an ICMP code (port_range_max) needs a type (port_range_min)", "port_range_min")
        for field, v in (("port_range_min", low), ("port_range_max", high)):
            if v is not None and not 0 <= v <= 255:
                raise Invalid("an ICMP type (port_range_min) and code (port_range_max) are 0..255", field)
        return low, high
    raise Invalid("port ranges need protocol tcp, udp or sctp (ICMP: type and code)",
                  "port_range_min")


def _check_prefix(prefix, ethertype: str) -> str | None:
    if prefix is None:
        return None
    try:
        net = ipaddress.ip_network(str(prefix), strict=False)
    except ValueError:
        raise Invalid(f"{str(prefix)[:64]!r} is not an IP prefix (CIDR)", "remote_ip_prefix") from None
    if (net.version == 4) != (ethertype == "IPv4"):
        raise Invalid(f"{net} is not an {ethertype} prefix", "remote_ip_prefix")
    return str(net)


def create_rule(session: Session, caller: Caller, *, security_group_id: int, direction: str,
                ethertype: str = "IPv4", protocol=None, port_range_min: int | None = None,
                port_range_max: int | None = None, remote_ip_prefix: str | None = None,
                remote_group_id: int | None = None, description: str = "",
                project_id: str | None = None, external_id: str | None = None) -> m.SecurityGroupRule:
    group = get_group(session, caller, security_group_id, "security_group_id")
    if project_id is not None and project_id != group.project_id:
        raise Invalid("a rule belongs to the project of its group", "project_id")
    if direction not in DIRECTIONS:
        raise Invalid(f"direction is one of {', '.join(DIRECTIONS)}", "direction")
    if ethertype not in ETHERTYPES:
        raise Invalid(f"ethertype is one of {', '.join(ETHERTYPES)}", "ethertype")
    number = parse_protocol(protocol, ethertype)
    low, high = _check_ports(number, port_range_min, port_range_max)
    if remote_ip_prefix is not None and remote_group_id is not None:
        raise Invalid("give remote_ip_prefix or remote_group_id, not both", "remote_group_id")
    prefix = _check_prefix(remote_ip_prefix, ethertype)
    if remote_group_id is not None:
        # another project's group is as absent as a missing one, for an admin too: rules never
        # reach across projects
        remote = session.get(m.SecurityGroup, remote_group_id) if valid_id(remote_group_id) else None
        if remote is None or not _visible(caller, remote) or remote.project_id != group.project_id:
            raise NotFound(f"security group {remote_group_id} does not exist in project "
                           f"{group.project_id!r}", "remote_group_id")
    count = session.scalar(select(func.count()).select_from(m.SecurityGroupRule)
                           .where(m.SecurityGroupRule.group_id == group.id))
    if count >= MAX_RULES_PER_GROUP:
        raise Conflict(f"security group {group.id} has {MAX_RULES_PER_GROUP} rules, the most a group may have",
                       "security_group_id")
    fields = dict(direction=direction, ethertype=ethertype, protocol=number, port_range_min=low,
                  port_range_max=high, remote_ip_prefix=prefix, remote_group_id=remote_group_id)
    for other in group.rules:
        if all(getattr(other, k) == v for k, v in fields.items()):
            raise Conflict(f"security group {group.id} has this rule already (rule {other.id})")
    rule = m.SecurityGroupRule(project_id=group.project_id, group_id=group.id, description=description,
                               external_id=_external_id(session, caller, m.SecurityGroupRule, external_id), **fields)
    session.add(rule)
    session.flush()
    group.status = "pending"
    return rule


def delete_rule(session: Session, caller: Caller, rule_id: int) -> None:
    rule = get_rule(session, caller, rule_id)
    session.get(m.SecurityGroup, rule.group_id).status = "pending"
    session.delete(rule)
    session.flush()


# ---------------------------------------------------------------------------------------------- ports


def _link_new_port(session: Session, port: m.Port, group_ids: list[int]) -> None:
    """The groups of a port just created: one not flushed yet gets them in its own flush (its
    creator's); one flushed already has no links yet (the collection is set as loaded, not read
    from the store)."""
    if inspect(port).pending:
        port.security_group_links = [m.PortSecurityGroup(group_id=g) for g in group_ids]
        return
    links = [m.PortSecurityGroup(port_id=port.id, group_id=g) for g in group_ids]
    session.add_all(links)
    set_committed_value(port, "security_group_links", links)
    session.flush()


def set_port_groups(session: Session, port: m.Port, group_ids: list[int] | None, *, creating: bool) -> None:
    """A port's groups: None on creation = its project's default group (none without port security);
    on update None = unchanged. Groups must be of the port's project; a port without port security
    has none."""
    if group_ids is None and not creating:
        if not port.port_security and port.security_group_links:
            raise Invalid("a port without port security has no security groups: give "
                          "security_groups [] with port_security false", "port_security")
        return
    wanted = new_port_groups(session, port.project_id, port.port_security, group_ids)
    if creating:
        _link_new_port(session, port, wanted)
        return
    have = {link.group_id: link for link in port.security_group_links}
    port.security_group_links = [have.get(g) or m.PortSecurityGroup(port_id=port.id, group_id=g)
                                 for g in wanted]
    session.flush()


def new_port_groups(session: Session, project: str, port_security: bool, group_ids: list[int] | None,
                    default: int | None = None) -> list[int]:
    """The checked groups of a port of `project` (in id order): None = the project's default group
    (none without port security). Groups must be of the port's project; a port without port security
    has none. `default`: the id of the project's default group, where the caller read it already
    (fathom.store.ops.NewPort.default_group)."""
    if group_ids is None:
        if not port_security:
            return []
        # the project's default group: of the port's project by construction, nothing to check
        if default is not None:
            return [default]
        if at_once(session):   # none when the caller read it: the group is made by a statement of its own
            raise NeedsTransaction("the project's default security group is to be made")
        row = session.get(m.DefaultSecurityGroup, project)
        return [row.group_id if row is not None else default_group(session, project).id]
    if group_ids and not port_security:
        raise Invalid("a port without port security has no security groups", "security_groups")
    if len(group_ids) > MAX_GROUPS_PER_PORT:
        raise Invalid(f"a port has at most {MAX_GROUPS_PER_PORT} security groups", "security_groups")
    wanted = []
    # one query for them all; session.get then finds each in the session
    keep(session, *session.scalars(select(m.SecurityGroup).where(
        m.SecurityGroup.id.in_([g for g in group_ids if valid_id(g)]))))
    for i, gid in enumerate(group_ids):
        group = session.get(m.SecurityGroup, gid) if valid_id(gid) else None
        if group is None or group.project_id != project:
            raise NotFound(f"security group {gid} does not exist in project {project!r}",
                           f"security_groups.{i}")
        if gid not in wanted:
            wanted.append(gid)
    return sorted(wanted)
