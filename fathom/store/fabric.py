"""The fabric in the store: building its part of the model (`load_fabric`), and the operations behind
`/v1/fabric/...` and a router's `mode`.

Every check raises a `fathom.store.errors` error naming the request field at fault; the API runs
each request in one transaction, so a refused request changes nothing.
"""
from __future__ import annotations

import time
from typing import Collection, Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from fathom import model
from fathom.model import FabricState, Link, Mode
from fathom.store import models as m
from fathom.store.errors import Conflict, Invalid, NotFound
from fathom.store.fabric_models import FabricLink, FabricSwitch, RouterMode, ROUTER_MODES

VLAN_MIN, VLAN_MAX = 1, 4094


def load_fabric(session: Session) -> FabricState:
    names = {n.id: n.name for n in session.scalars(select(m.Node))}
    switches = tuple(model.FabricSwitch(s.id, s.name, s.management_ip, s.bridge, s.vlan_min, s.vlan_max)
                     for s in session.scalars(select(FabricSwitch).order_by(FabricSwitch.id)))
    links = tuple(Link(x.switch_id, x.port_name, x.ofport, names[x.node_id], x.source, x.last_seen)
                  for x in session.scalars(select(FabricLink).order_by(FabricLink.id)) if x.node_id in names)
    modes = tuple(Mode(r.router_id, r.mode, names.get(r.gateway_node_id))
                  for r in session.scalars(select(RouterMode).order_by(RouterMode.router_id)))
    return FabricState(switches, links, modes)


# ---------------------------------------------------------------------------------------------- operations


def vlan_range(session: Session) -> tuple[int, int] | None:
    """The VLAN ids every fabric switch accepts (their ranges' intersection), None without a fabric."""
    rows = session.scalars(select(FabricSwitch)).all()
    if not rows:
        return None
    return max(r.vlan_min for r in rows), min(r.vlan_max for r in rows)


def check_network_vlan(session: Session, segmentation_id: int | None) -> tuple[int, int] | None:
    """Called by create_network for VLAN networks: with a fabric, VLAN ids come from its range."""
    rng = vlan_range(session)
    if rng and segmentation_id is not None and not rng[0] <= segmentation_id <= rng[1]:
        raise Invalid(f"VLAN id {segmentation_id} is outside the fabric's VLAN range {rng[0]}-{rng[1]}",
                      "segmentation_id")
    return rng


def create_switch(session: Session, *, name: str, management_ip: str, bridge: str = "br-fabric",
                  vlan_min: int = 100, vlan_max: int = 999, links: Mapping[str, str] | None = None) -> FabricSwitch:
    if not VLAN_MIN <= vlan_min <= vlan_max <= VLAN_MAX:
        field_ = "vlan_min" if not VLAN_MIN <= vlan_min <= VLAN_MAX or vlan_min > vlan_max else "vlan_max"
        raise Invalid(f"the VLAN range must satisfy {VLAN_MIN} <= vlan_min <= vlan_max <= {VLAN_MAX}", field_)
    if session.scalar(select(FabricSwitch).where(FabricSwitch.name == name)):
        raise Conflict(f"a fabric switch named {name!r} exists", "name")
    outside = session.scalars(select(m.Network).where(
        m.Network.type == "vlan", ~m.Network.segmentation_id.between(vlan_min, vlan_max))).all()
    if outside:
        raise Conflict(f"VLAN network(s) {sorted(n.id for n in outside)} use ids outside {vlan_min}-{vlan_max}",
                       "vlan_min")
    sw = FabricSwitch(name=name, management_ip=management_ip, bridge=bridge, vlan_min=vlan_min,
                      vlan_max=vlan_max, project_id="admin", status="pending")
    session.add(sw)
    session.flush()
    for i, (node, port) in enumerate(sorted((links or {}).items())):
        declare_link(session, sw, node, port, f"links.{node}")
    return sw


def declare_link(session: Session, sw: FabricSwitch, node_name: str, port_name: str, field_: str) -> FabricLink:
    node = session.scalar(select(m.Node).where(m.Node.name == node_name))
    if node is None:
        raise NotFound(f"node {node_name!r} does not exist", field_)
    link = session.scalar(select(FabricLink).where(FabricLink.switch_id == sw.id, FabricLink.source == "declared",
                                                   FabricLink.node_id == node.id))
    if link is None:
        link = FabricLink(switch_id=sw.id, port_name=port_name, node_id=node.id, source="declared")
        session.add(link)
    link.port_name = port_name
    session.flush()
    return link


def record_lldp_link(session: Session, switch_id: int, port_name: str, ofport: int, node_id: int) -> bool:
    """An LLDP probe showed `port_name` of the switch facing node `node_id`. True if that is news
    (a new link, or the port now faces another node); only the time of an old one is refreshed."""
    now = time.time()
    if session.get(FabricSwitch, switch_id) is None or session.get(m.Node, node_id) is None:
        return False
    news = False
    # a node is behind one port: an older LLDP link of this node elsewhere is gone
    for old in session.scalars(select(FabricLink).where(FabricLink.switch_id == switch_id,
                                                        FabricLink.source == "lldp")):
        if (old.node_id == node_id) != (old.port_name == port_name):
            session.delete(old)
            news = True
    link = session.scalar(select(FabricLink).where(FabricLink.switch_id == switch_id, FabricLink.source == "lldp",
                                                   FabricLink.port_name == port_name))
    if link is None:
        session.flush()
        session.add(FabricLink(switch_id=switch_id, port_name=port_name, ofport=ofport, node_id=node_id,
                               source="lldp", last_seen=now))
        news = True
    else:
        news = news or link.ofport != ofport
        link.ofport, link.last_seen = ofport, now
    session.flush()
    return news


def get_switch(session: Session, switch_id: int) -> FabricSwitch:
    sw = session.get(FabricSwitch, switch_id) if 0 < switch_id < 2 ** 31 else None
    if sw is None:
        raise NotFound(f"fabric switch {switch_id} does not exist")
    return sw


def delete_switch(session: Session, switch_id: int) -> None:
    sw = get_switch(session, switch_id)
    used = session.scalars(select(RouterMode).where(RouterMode.mode == "fabric")).all()
    if used and len(session.scalars(select(FabricSwitch)).all()) == 1:
        raise Conflict(f"router(s) {sorted(r.router_id for r in used)} run in the fabric: move them first")
    session.delete(sw)
    session.flush()


def links_of(session: Session, switch_ids: Collection[int]) -> dict[int, list[FabricLink]]:
    """The links of each of the switches by switch id, in id order, read in one statement."""
    links: dict[int, list[FabricLink]] = {i: [] for i in switch_ids}
    for x in session.scalars(select(FabricLink).where(FabricLink.switch_id.in_(links)).order_by(FabricLink.id)):
        links[x.switch_id].append(x)
    return links


def get_mode(session: Session, router: m.Router) -> RouterMode:
    row = session.get(RouterMode, router.id)
    return row if row is not None else _distributed(router.id)


def modes_of(session: Session, router_ids: Collection[int]) -> dict[int, RouterMode]:
    """get_mode of each of the routers by id, read in one statement."""
    rows = {r.router_id: r for r in session.scalars(select(RouterMode).where(RouterMode.router_id.in_(router_ids)))}
    return {i: rows.get(i) or _distributed(i) for i in router_ids}


def _distributed(router_id: int) -> RouterMode:
    """The mode of a router without a mode row (a row is written by set_router_mode only)."""
    return RouterMode(router_id=router_id, mode="distributed", gateway_node_id=None)


def set_router_mode(session: Session, router: m.Router, mode: str, gateway_node: str | None = None) -> RouterMode:
    """Move a router to `mode`. Refused (nothing changes) when the topology cannot carry it."""
    if mode not in ROUTER_MODES:
        raise Invalid(f"mode must be one of {', '.join(ROUTER_MODES)}", "mode")
    gateway = None
    if gateway_node is not None and mode != "network-node":
        raise Invalid("gateway_node is for mode network-node only", "gateway_node")
    if mode == "fabric":
        if not session.scalars(select(FabricSwitch)).first():
            raise Conflict("mode fabric needs a fabric switch (POST /v1/fabric/switches): there is none", "mode")
        interfaces = session.scalars(select(m.Port).where(m.Port.router_id == router.id)).all()
        for interface in interfaces:
            net = session.get(m.Network, interface.network_id)
            if net.type != "vlan":
                raise Conflict(f"mode fabric routes VLAN networks only: network {net.id} ({net.name or '-'}) "
                               f"of router {router.id} is {net.type}", "mode")
    if mode == "network-node":
        if gateway_node is not None:
            gateway = session.scalar(select(m.Node).where(m.Node.name == gateway_node))
            if gateway is None:
                raise NotFound(f"node {gateway_node!r} does not exist", "gateway_node")
            if gateway.role != "gateway":
                raise Conflict(f"node {gateway_node!r} has role {gateway.role}, not gateway", "gateway_node")
        else:
            gateway = session.scalar(select(m.Node).where(m.Node.role == "gateway").order_by(m.Node.id))
            if gateway is None:
                raise Conflict("mode network-node needs a node of role gateway: there is none", "mode")
    row = session.get(RouterMode, router.id)
    if row is None:
        row = RouterMode(router_id=router.id)
        session.add(row)
    row.mode = mode
    row.gateway_node_id = gateway.id if gateway is not None else None
    router.status = "pending"
    session.flush()
    return row


def check_interface_mode(session: Session, router: m.Router, network: m.Network) -> None:
    """A fabric-mode router takes interfaces on VLAN networks only."""
    row = session.get(RouterMode, router.id)
    if row is not None and row.mode == "fabric" and network.type != "vlan":
        raise Conflict(f"router {router.id} runs in the fabric, which routes VLAN networks only "
                       f"(network {network.id} is {network.type})", "subnet_id")
