"""Store operations of service function chains (networking-sfc's resources): port pairs, port pair
groups, flow classifiers, port chains. Like fathom/store/ops.py, every check raises a
fathom.store.errors error naming the request field at fault (`port_pairs.1` = the second item).

Rules (networking-sfc's, plus what the steering needs):
- a port pair's ingress and egress are two ports of one network and one project, with port
  security off (a VNF forwards packets that are not its own); a port is in at most one pair and is
  never a classifier's logical source or destination port (the switch knows a packet's place in a chain by the
  port it comes back from);
- a pair is in at most one group, a group and a classifier in at most one chain; a chain's ports
  (its pairs' and its classifiers') are all on one network;
- a symmetric chain's classifiers name a logical destination port (replies are classified there);
- what enters one chain never overlaps what enters another (`flow_classifiers.N`, 409);
- a chain's `pptmon` ({"period_ns": N}, null = off) needs a VNF id per instance (at most
  MAX_PPTMON_INSTANCES) and an entry per group in the option (at most MAX_PPTMON_GROUPS);
- a member in use cannot be deleted (a port in a pair or classifier, a pair in a group, a group
  or classifier in a chain): delete or update the user first.
"""
from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from fathom.model import classifiers as cls
from fathom.model.chains import MAX_PPTMON_GROUPS, MAX_PPTMON_INSTANCES
from fathom.model.chains import MAX_CHAIN_ID, MAX_GROUPS, MAX_INSTANCES
from fathom.store import models as m
from fathom.store import sfc_models as sm
from fathom.store.errors import Conflict, Invalid, NotFound
from fathom.store.ops import Caller, _external_id, _owner, valid_id
from fathom.store.snapshot import load_snapshot
from fathom.store.taps import resolve

WAITING = "waiting for the switches to hold it"
KINDS = {sm.PortPair: "port pair", sm.PortPairGroup: "port pair group", sm.FlowClassifier: "flow classifier",
         sm.PortChain: "port chain"}


def get(session: Session, caller: Caller, model, object_id: int, field: str | None = None):
    obj = session.get(model, object_id) if valid_id(object_id) else None
    if obj is None or not (caller.admin or obj.project_id == caller.project):
        raise NotFound(f"{KINDS[model]} {object_id} does not exist", field)
    return obj


def _ref(session: Session, caller: Caller, model, ref, field: str):
    """A member given by id or by name (unique among the caller's)."""
    if isinstance(ref, bool) or not isinstance(ref, (int, str)) or (isinstance(ref, str) and not ref.strip()):
        raise Invalid(f"give a {KINDS[model]} id or name", field)
    if isinstance(ref, int) or (ref.isascii() and ref.isdigit()):
        return get(session, caller, model, int(ref), field)
    query = select(model).where(model.name == ref).order_by(model.id)
    if not caller.admin:
        query = query.where(model.project_id == caller.project)
    found = session.scalars(query).all()
    if not found:
        raise NotFound(f"no {KINDS[model]} named {ref[:64]!r}", field)
    if len(found) > 1:
        raise Invalid(f"{len(found)} {KINDS[model]}s are named {ref[:64]!r} (ids "
                      f"{', '.join(str(o.id) for o in found)}): use an id", field)
    return found[0]


def _port(session: Session, caller: Caller, ref, field: str, project: str) -> m.Port:
    port = resolve(session, caller, ref, field, must_be_port=True)
    if port.project_id != project:
        raise Invalid(f"port {port.id} belongs to project {port.project_id!r}, not {project!r}", field)
    return port


def _same_project(obj, project: str, field: str) -> None:
    if obj.project_id != project:
        raise Invalid(f"{KINDS[type(obj)]} {obj.id} belongs to project {obj.project_id!r}, not {project!r}",
                      field)


def _pending(obj) -> None:
    obj.status, obj.status_reason = "pending", WAITING


# ---------------------------------------------------------------------------------------------- port pairs


def _pair_using(session: Session, port_id: int, other_than: int | None = None) -> sm.PortPair | None:
    q = select(sm.PortPair).where(or_(sm.PortPair.ingress_port_id == port_id, sm.PortPair.egress_port_id == port_id))
    return next((p for p in session.scalars(q) if p.id != other_than), None)


def _classifier_naming(session: Session, port_id: int) -> sm.FlowClassifier | None:
    """A classifier whose logical source or destination port is `port_id`."""
    return session.scalars(select(sm.FlowClassifier).where(or_(
        sm.FlowClassifier.logical_source_port_id == port_id, sm.FlowClassifier.logical_destination_port_id == port_id))
        .order_by(sm.FlowClassifier.id)).first()


def create_port_pair(session: Session, caller: Caller, body: dict) -> sm.PortPair:
    project = _owner(caller, body.get("project_id"))
    for field in ("ingress", "egress"):
        if body.get(field) is None:
            raise Invalid(f"{field} is required (a port id or name)", field)
    ports = {f: _port(session, caller, body[f], f, project) for f in ("ingress", "egress")}
    if ports["ingress"].id == ports["egress"].id:
        raise Invalid("ingress and egress must be two ports (the steering tells the directions apart by "
                      "the port a packet comes back from)", "egress")
    if ports["egress"].network_id != ports["ingress"].network_id:
        raise Invalid(f"egress is on network {ports['egress'].network_id}, ingress on "
                      f"{ports['ingress'].network_id}: a port pair's ports share one network", "egress")
    for field, port in ports.items():
        if port.port_security:
            raise Invalid(f"port {port.id} has port security on: a VNF forwards packets that are not its own, "
                          f"turn it off (PATCH /v1/ports/{port.id} port_security=false)", field)
        pair = _pair_using(session, port.id)
        if pair is not None:
            raise Conflict(f"port {port.id} is in port pair {pair.id} already", field)
        fc = _classifier_naming(session, port.id)
        if fc is not None:
            raise Conflict(f"port {port.id} is named by flow classifier {fc.id}: a VNF port is never a chain's "
                           "source or destination", field)
    pair = sm.PortPair(name=body.get("name") or "", project_id=project, ingress_port_id=ports["ingress"].id,
                       egress_port_id=ports["egress"].id,
                       external_id=_external_id(session, caller, sm.PortPair, body.get("external_id")))
    _pending(pair)
    session.add(pair)
    session.flush()
    return pair


def update_port_pair(session: Session, caller: Caller, pair_id: int, changes: dict) -> sm.PortPair:
    pair = get(session, caller, sm.PortPair, pair_id)
    if changes.get("name") is not None:
        pair.name = changes["name"]
    session.flush()
    return pair


def delete_port_pair(session: Session, caller: Caller, pair_id: int) -> None:
    pair = get(session, caller, sm.PortPair, pair_id)
    if pair.group_id is not None:
        raise Conflict(f"port pair {pair.id} is in port pair group {pair.group_id}: remove it from the group first")
    session.delete(pair)
    session.flush()


# ---------------------------------------------------------------------------------------------- groups


def pairs_of(session: Session, group_id: int) -> list[sm.PortPair]:
    return list(session.scalars(select(sm.PortPair).where(sm.PortPair.group_id == group_id).order_by(sm.PortPair.id)))


def _set_pairs(session: Session, caller: Caller, group: sm.PortPairGroup, refs) -> None:
    if not isinstance(refs, list) or not refs:
        raise Invalid("port_pairs is a non-empty list of port pair ids or names", "port_pairs")
    if len(refs) > MAX_INSTANCES:
        raise Invalid(f"a group holds at most {MAX_INSTANCES} port pairs", "port_pairs")
    pairs = []
    for i, ref in enumerate(refs):
        field = f"port_pairs.{i}"
        pair = _ref(session, caller, sm.PortPair, ref, field)
        _same_project(pair, group.project_id, field)
        if pair in pairs:
            raise Invalid(f"port pair {pair.id} is listed twice", field)
        if pair.group_id is not None and pair.group_id != group.id:
            raise Conflict(f"port pair {pair.id} is in port pair group {pair.group_id} already", field)
        if pairs and _network(session, pair) != _network(session, pairs[0]):
            raise Invalid(f"port pair {pair.id} is on network {_network(session, pair)}, port pair "
                          f"{pairs[0].id} on {_network(session, pairs[0])}: a group's pairs share one network", field)
        pairs.append(pair)
    if group.id is not None:
        for old in pairs_of(session, group.id):
            if old not in pairs:
                old.group_id = None
    session.flush()
    for pair in pairs:
        pair.group_id = group.id


def _network(session: Session, pair: sm.PortPair) -> int:
    return session.get(m.Port, pair.ingress_port_id).network_id


def create_port_pair_group(session: Session, caller: Caller, body: dict) -> sm.PortPairGroup:
    project = _owner(caller, body.get("project_id"))
    group = sm.PortPairGroup(name=body.get("name") or "", project_id=project,
                             external_id=_external_id(session, caller, sm.PortPairGroup, body.get("external_id")))
    _pending(group)
    session.add(group)
    session.flush()
    _set_pairs(session, caller, group, body.get("port_pairs"))
    session.flush()
    return group


def update_port_pair_group(session: Session, caller: Caller, group_id: int, changes: dict) -> sm.PortPairGroup:
    group = get(session, caller, sm.PortPairGroup, group_id)
    if changes.get("name") is not None:
        group.name = changes["name"]
    if "port_pairs" in changes:
        _set_pairs(session, caller, group, changes["port_pairs"])
        session.flush()
        if group.chain_id is not None:
            _check_chain(session, session.get(sm.PortChain, group.chain_id), "port_pairs")
            _check_pptmon(session, session.get(sm.PortChain, group.chain_id), "port_pairs")
            _pending(session.get(sm.PortChain, group.chain_id))
    session.flush()
    return group


def delete_port_pair_group(session: Session, caller: Caller, group_id: int) -> None:
    group = get(session, caller, sm.PortPairGroup, group_id)
    if group.chain_id is not None:
        raise Conflict(f"port pair group {group.id} is in port chain {group.chain_id}: remove it from the chain first")
    for pair in pairs_of(session, group.id):
        pair.group_id = None
    session.delete(group)
    session.flush()


# ---------------------------------------------------------------------------------------------- classifiers


def create_flow_classifier(session: Session, caller: Caller, body: dict) -> sm.FlowClassifier:
    project = _owner(caller, body.get("project_id"))
    ethertype = body.get("ethertype") or "IPv4"
    if ethertype != "IPv4":
        raise Invalid("only IPv4 is classified", "ethertype")
    if body.get("logical_source_port") is None:
        raise Invalid("logical_source_port is required: the port whose traffic enters the chain",
                      "logical_source_port")
    src = _port(session, caller, body["logical_source_port"], "logical_source_port", project)
    pair = _pair_using(session, src.id)
    if pair is not None:
        raise Invalid(f"port {src.id} is a VNF port (port pair {pair.id}): a chain's source is a workload port",
                      "logical_source_port")
    dst_id = None
    if body.get("logical_destination_port") is not None:
        dst = _port(session, caller, body["logical_destination_port"], "logical_destination_port", project)
        if dst.network_id != src.network_id:
            raise Invalid(f"port {dst.id} is on network {dst.network_id}, the source port on {src.network_id}: "
                          "a chain steers within one network", "logical_destination_port")
        if dst.id == src.id:
            raise Invalid("the destination port is the source port", "logical_destination_port")
        if _pair_using(session, dst.id) is not None:
            raise Invalid(f"port {dst.id} is a VNF port", "logical_destination_port")
        dst_id = dst.id
    try:
        protocol = cls.protocol_number(body.get("protocol"))
        values = dict(
            protocol=protocol,
            source_ip_prefix=cls.prefix(body.get("source_ip_prefix"), "source_ip_prefix"),
            destination_ip_prefix=cls.prefix(body.get("destination_ip_prefix"), "destination_ip_prefix"),
            source_port_range=cls.port_range(body.get("source_port_range_min"), body.get("source_port_range_max"),
                                             "source_port_range"),
            destination_port_range=cls.port_range(body.get("destination_port_range_min"),
                                                  body.get("destination_port_range_max"), "destination_port_range"))
        cls.check(cls.FlowClassifier(0, "", project, src.id, dst_id, **values))
    except cls.ClassifierError as e:
        raise Invalid(e.message, e.field) from None
    sp, dp = values.pop("source_port_range"), values.pop("destination_port_range")
    fc = sm.FlowClassifier(name=body.get("name") or "", project_id=project, logical_source_port_id=src.id,
                           logical_destination_port_id=dst_id, **values,
                           source_port_range_min=sp[0] if sp else None, source_port_range_max=sp[1] if sp else None,
                           destination_port_range_min=dp[0] if dp else None,
                           destination_port_range_max=dp[1] if dp else None,
                           external_id=_external_id(session, caller, sm.FlowClassifier, body.get("external_id")))
    _pending(fc)
    session.add(fc)
    session.flush()
    return fc


def update_flow_classifier(session: Session, caller: Caller, fc_id: int, changes: dict) -> sm.FlowClassifier:
    fc = get(session, caller, sm.FlowClassifier, fc_id)
    if changes.get("name") is not None:
        fc.name = changes["name"]
    session.flush()
    return fc


def delete_flow_classifier(session: Session, caller: Caller, fc_id: int) -> None:
    fc = get(session, caller, sm.FlowClassifier, fc_id)
    if fc.chain_id is not None:
        raise Conflict(f"flow classifier {fc.id} is in port chain {fc.chain_id}: remove it from the chain first")
    session.delete(fc)
    session.flush()


# ---------------------------------------------------------------------------------------------- chains


def groups_of(session: Session, chain_id: int) -> list[sm.PortPairGroup]:
    return list(session.scalars(select(sm.PortPairGroup).where(sm.PortPairGroup.chain_id == chain_id)
                                .order_by(sm.PortPairGroup.position)))


def classifiers_of(session: Session, chain_id: int) -> list[sm.FlowClassifier]:
    return list(session.scalars(select(sm.FlowClassifier).where(sm.FlowClassifier.chain_id == chain_id)
                                .order_by(sm.FlowClassifier.id)))


def _set_groups(session: Session, caller: Caller, chain: sm.PortChain, refs) -> None:
    if not isinstance(refs, list) or not refs:
        raise Invalid("port_pair_groups is a non-empty list of port pair group ids or names", "port_pair_groups")
    if len(refs) > MAX_GROUPS:
        raise Invalid(f"a chain has at most {MAX_GROUPS} port pair groups", "port_pair_groups")
    groups = []
    for i, ref in enumerate(refs):
        field = f"port_pair_groups.{i}"
        group = _ref(session, caller, sm.PortPairGroup, ref, field)
        _same_project(group, chain.project_id, field)
        if group in groups:
            raise Invalid(f"port pair group {group.id} is listed twice", field)
        if group.chain_id is not None and group.chain_id != chain.id:
            raise Conflict(f"port pair group {group.id} is in port chain {group.chain_id} already", field)
        groups.append(group)
    for old in groups_of(session, chain.id):
        old.chain_id, old.position = None, None
    session.flush()
    for i, group in enumerate(groups):
        group.chain_id, group.position = chain.id, i


def _set_classifiers(session: Session, caller: Caller, chain: sm.PortChain, refs) -> list[sm.FlowClassifier]:
    if not isinstance(refs, list):
        raise Invalid("flow_classifiers is a list of flow classifier ids or names", "flow_classifiers")
    fcs = []
    for i, ref in enumerate(refs):
        field = f"flow_classifiers.{i}"
        fc = _ref(session, caller, sm.FlowClassifier, ref, field)
        _same_project(fc, chain.project_id, field)
        if fc in fcs:
            raise Invalid(f"flow classifier {fc.id} is listed twice", field)
        if fc.chain_id is not None and fc.chain_id != chain.id:
            raise Conflict(f"flow classifier {fc.id} is in port chain {fc.chain_id} already", field)
        fcs.append(fc)
    for old in classifiers_of(session, chain.id):
        old.chain_id = None
    session.flush()
    for fc in fcs:
        fc.chain_id = chain.id
    return fcs


def _check_chain(session: Session, chain: sm.PortChain, field: str | None = None,
                 fcs: list[sm.FlowClassifier] | None = None) -> None:
    """One network for every port of the chain; symmetric chains name destination ports; nothing
    that enters this chain overlaps what enters another. `fcs`: the classifiers in the order of the
    request (errors name their index there)."""
    groups = groups_of(session, chain.id)
    fcs = classifiers_of(session, chain.id) if fcs is None else fcs
    network = None
    for i, group in enumerate(groups):
        for pair in pairs_of(session, group.id):
            net = _network(session, pair)
            if network is None:
                network = (net, f"port pair group {group.id}")
            elif net != network[0]:
                raise Invalid(f"port pair group {group.id} is on network {net}, {network[1]} on {network[0]}: "
                              "a chain steers within one network", field or f"port_pair_groups.{i}")
    for i, fc in enumerate(fcs):
        net = session.get(m.Port, fc.logical_source_port_id).network_id
        if network is not None and net != network[0]:
            raise Invalid(f"flow classifier {fc.id} classifies on network {net}, {network[1]} is on "
                          f"{network[0]}: a chain steers within one network", field or f"flow_classifiers.{i}")
        if chain.symmetric and fc.logical_destination_port_id is None:
            raise Invalid(f"flow classifier {fc.id} has no logical_destination_port: a symmetric chain classifies "
                          "the replies there", field or f"flow_classifiers.{i}")
    session.flush()
    conflicts = cls.conflicting_chains(load_snapshot(session), chain.id)
    if conflicts:
        fc_id, other = conflicts[0]
        index = next((i for i, fc in enumerate(fcs) if fc.id == fc_id), 0)
        raise Conflict(f"flow classifier {fc_id} overlaps what enters port chain {other} (same source port, "
                       "intersecting fields): one packet would belong to two chains", field or f"flow_classifiers.{index}")


MAX_PERIOD_NS = 3600 * 10**9


def _pptmon(value) -> dict | None:
    """A chain's `pptmon` as stored: {"period_ns": N} or None (off)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"period_ns"}:
        raise Invalid('pptmon is {"period_ns": N} or null (off)', "pptmon")
    period = value.get("period_ns", 10**9)
    if isinstance(period, bool) or not isinstance(period, int) or not 0 <= period <= MAX_PERIOD_NS:
        raise Invalid(f"period_ns is 0 (every packet) to {MAX_PERIOD_NS} ns", "pptmon.period_ns")
    return {"period_ns": period}


def _check_pptmon(session: Session, chain: sm.PortChain, field: str) -> None:
    """A measured chain fits the option: one entry per group, one VNF id per instance."""
    if not chain.pptmon:
        return
    groups = groups_of(session, chain.id)
    if len(groups) > MAX_PPTMON_GROUPS:
        raise Invalid(f"PPTMon measures chains of at most {MAX_PPTMON_GROUPS} port pair groups (one entry each in "
                      f"the packet's option); this one has {len(groups)}", field)
    n = sum(len(pairs_of(session, g.id)) for g in groups)
    if n > MAX_PPTMON_INSTANCES:
        raise Invalid(f"PPTMon gives each VNF instance of a chain a 1-byte id: at most {MAX_PPTMON_INSTANCES} "
                      f"port pairs, this chain has {n}", field)


def create_port_chain(session: Session, caller: Caller, body: dict) -> sm.PortChain:
    project = _owner(caller, body.get("project_id"))
    params = body.get("chain_parameters") or {}
    chain = sm.PortChain(name=body.get("name") or "", project_id=project, symmetric=bool(params.get("symmetric")),
                         external_id=_external_id(session, caller, sm.PortChain, body.get("external_id")),
                         pptmon=_pptmon(body.get("pptmon")))
    _pending(chain)
    session.add(chain)
    session.flush()
    if chain.id > MAX_CHAIN_ID:
        raise Conflict(f"chain ids end at {MAX_CHAIN_ID} (the hop marker has room for no more)")
    _set_groups(session, caller, chain, body.get("port_pair_groups"))
    fcs = _set_classifiers(session, caller, chain, body.get("flow_classifiers") or [])
    _check_chain(session, chain, fcs=fcs)
    _check_pptmon(session, chain, "pptmon")
    return chain


def update_port_chain(session: Session, caller: Caller, chain_id: int, changes: dict) -> sm.PortChain:
    chain = get(session, caller, sm.PortChain, chain_id)
    if changes.get("name") is not None:
        chain.name = changes["name"]
    if "port_pair_groups" in changes:
        _set_groups(session, caller, chain, changes["port_pair_groups"])
    fcs = None
    if "flow_classifiers" in changes:
        fcs = _set_classifiers(session, caller, chain, changes["flow_classifiers"] or [])
    if "port_pair_groups" in changes or "flow_classifiers" in changes:
        session.flush()
        _check_chain(session, chain, fcs=fcs)
        _pending(chain)
    if "pptmon" in changes:
        new = _pptmon(changes["pptmon"])
        if new != chain.pptmon:
            chain.pptmon = new
            _pending(chain)
    if "pptmon" in changes or "port_pair_groups" in changes:
        session.flush()
        _check_pptmon(session, chain, "pptmon" if "pptmon" in changes else "port_pair_groups")
    session.flush()
    return chain


def delete_port_chain(session: Session, caller: Caller, chain_id: int) -> None:
    chain = get(session, caller, sm.PortChain, chain_id)
    for group in groups_of(session, chain.id):
        group.chain_id, group.position = None, None
    for fc in classifiers_of(session, chain.id):
        fc.chain_id = None
    session.flush()
    session.delete(chain)
    session.flush()


def port_users(session: Session, port_id: int) -> str | None:
    """Why a port cannot be deleted (it is in a port pair or a flow classifier), or None."""
    pair = _pair_using(session, port_id)
    if pair is not None:
        return f"port {port_id} is in port pair {pair.id}: delete the port pair first"
    fc = session.scalars(select(sm.FlowClassifier).where(or_(
        sm.FlowClassifier.logical_source_port_id == port_id,
        sm.FlowClassifier.logical_destination_port_id == port_id))).first()
    if fc is not None:
        return f"port {port_id} is named by flow classifier {fc.id}: delete the flow classifier first"
    return None
