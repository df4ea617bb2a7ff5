"""One status model: where each kind's status comes from, decided after every pass.

| kind | status comes from |
|---|---|
| node | its br-int: OVSDB bootstrap, then the OpenFlow connection, then the last apply |
| fabric_switch | the fabric switch: OVSDB bootstrap, then the OpenFlow connection, then the last apply |
| network, port, router_interface, tap_policy | the switches that must hold its flows (found by the flows' cookies): `active` only when they took them (see below for a switch in trouble) |
| subnet | its network (a subnet has no flows of its own: its addresses live in its network's and ports' flows) |
| router | its interfaces; a `network-node` router also its namespace on the gateway node (the agent); a router with an external gateway also the gateway's flows (and `pending` until its gateway node has its external port `ext0`) |
| pptmon_attachment | the node's agent (it loads and attaches the programs) |
| security_group | the switches that must hold its flows and its rules' flows (found by the cookies); `active` when none needs any |
| port_chain | the switches that must hold its flows, like a tap policy; a problem the sfc app reports (a port not plugged: `pending`; no hop marker: `error`) first; with `pptmon`, also the agents holding its VNFs' PPTMon programs (the sfc app says what they said) |
| port_pair | its two ports |
| port_pair_group | its port pairs |
| flow_classifier | its logical source (and destination) port |
| floating_ip | the switches that must hold its flows (the gateway node); `active` when not associated |
| port holding a gateway's or floating IP's address | its owner (the router's gateway, the floating IP) |

Objects a node's agent holds (fathom.model.hostlocal; `hostlocal` below) are `active` when the agent
applied the revision that holds them and says so, `pending` while it has not yet, and `error` with
the reason when it says so or when it is down (no report for `stale_after` seconds): "agent on
node N not reporting since HH:MM:SS". The host keeps what it had meanwhile (namespaces forward,
programs stay attached): only the status says the controller cannot vouch for it.

`down` is a port whose VIF is not plugged (or that is not bound); `pending` says what is awaited (a
switch connecting, a namespace being built), `error` names the switch or node at fault; a refused flow marks exactly its object.

A switch in trouble of its own (OVSDB unreachable, its OpenFlow connection lost, not connected
yet) marks the objects *at home* there: a port's home is its node's switches, a `fabric` router
interface's the fabric switch (the fabric switch routes). A port on another node keeps its status (its flows on the sick
switch only serve traffic from there, which is down anyway); an object with no home (a network, a
distributed router interface, a tap policy) is held back only when no switch holding its flows is
healthy. A failed apply on a connected switch is an error of every object with flows there (any may
be the cause), unless the switch named the refused messages. An
object none of whose flows any switch needs yet (a network with no bound port) is `active`, except
a port: it is `down` (with the reason) until it is bound and its VIF is plugged on its node (OVSDB:
an interface of its name on the node's br-int with an OpenFlow port number), and `active` only
when, moreover, every switch that must hold its flows has committed them (the bundle's commit
reply, in the pass that covered the port's last change; the reconciler publishes a status turning
`active` once those datapaths have settled and answered a barrier: Reconciler._write_statuses).

What an app finds wrong with its objects comes from the app (`App.status`: typed problems, each with
its severity and the object it is about; fathom.model.status): a tap policy with a deleted or
unbound port, a port chain the sfc app cannot wholly steer, a router gateway the external app does
not support or whose node has no external port. A problem the app could not compile past is the
object's status instead of its flows'; one beside its flows (a chain's PPTMon programs) is merged
with them; a warning shows while the object is active. This module knows no app.

`decide` is pure (model + pass result in, statuses out); fathom.store.status writes them.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from fathom.apps import BR_INT, BR_PHY, FABRIC_SWITCH, SwitchKey, registry
from fathom.model.routers import effective_modes
from fathom.model.status import Severity, Status, worst
from fathom.model.views import changes, ports_by_id
from fathom.pipeline import cookies as ck

FLOWS = "flows"
SOURCES = {
    "node": "br-int",
    "fabric_switch": "fabric-switch",
    "network": FLOWS,
    "port": FLOWS,
    "router_interface": FLOWS,
    "tap_policy": FLOWS,
    "port_chain": FLOWS,
    "subnet": "network",
    "router": "router_interfaces",
    "router_gateway": FLOWS,     # not stored on its own: part of its router's status
    "floating_ip": FLOWS,
    "security_group": FLOWS,
    "security_group_rule": FLOWS,   # no status of its own: part of its group's
    "port_pair": "ports",
    "port_pair_group": "port_pairs",
    "flow_classifier": "ports",
}
# cookie kinds whose flows realise an object of a status kind (a network-node router's interface is a
# port of the gateway node: its flows carry the port kind with the interface's id)
FLOW_KINDS = {"network": (ck.KIND_NETWORK,), "port": (ck.KIND_PORT,),
              "router_interface": (ck.KIND_ROUTER_INTERFACE, ck.KIND_PORT), "tap_policy": (ck.KIND_TAP_POLICY,),
              "router_gateway": (ck.KIND_ROUTER,), "floating_ip": (ck.KIND_FLOATING_IP,),
              "security_group": (ck.KIND_SECURITY_GROUP,), "security_group_rule": (ck.KIND_SECURITY_GROUP_RULE,),
              "port_chain": (ck.KIND_PORT_CHAIN,)}

HOST_BRIDGES = (BR_INT, BR_PHY)   # a port's home: its node's switches


def _where(key: SwitchKey) -> str:
    return f"fabric switch {key.name}" if key.bridge == FABRIC_SWITCH else f"node {key.name}"


def switch_problem(res) -> tuple[str, str, bool] | None:
    """What a switch that must hold some flows says about them: (status, reason, whether it is the
    switch's own health rather than our change); None when it holds them."""
    if res is None:
        return "pending", "switch unknown", True
    where = _where(res.key)
    bridge = "" if res.key.bridge == FABRIC_SWITCH else f"{res.key.bridge} "
    if res.setup == "error":
        return "error", f"{where}: {res.reason}", True
    if res.state.startswith("lost"):
        return "error", f"{where}: {res.state.removeprefix('lost: ')}", True
    if res.state.startswith("error"):
        return "error", f"{where}: {bridge}{res.state}", False
    if res.state != "ok":
        return "pending", f"{where}: {bridge}{res.state}", True
    return None


def owners_needed(desired) -> dict[tuple[int, int], set[SwitchKey]]:
    """(kind, object id) -> the switches that must hold some flow or group of it."""
    needs: dict[tuple[int, int], set[SwitchKey]] = defaultdict(set)
    for key, state in desired.items():
        for kind_obj in switch_owners(state):
            needs[kind_obj].add(key)
    return needs


def switch_owners(state) -> set[tuple[int, int]]:
    """(kind, object id) of everything a switch's desired state holds."""
    return {ck.parse_cookie(spec.cookie)[1:] for spec in (*state.flows, *state.groups)}


@dataclass
class PortStatuses:
    """What `decide` keeps from one pass to the next so that it decides again only the ports a
    change reached (ports are most of a cloud's objects; every other kind is decided each pass):
    the model, switches in trouble and refused owners it decided with, and the ports' statuses."""
    model: object = None
    trouble: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)
    statuses: dict = field(default_factory=dict)     # ("port", id) -> status
    passes: dict = field(default_factory=lambda: {"whole": 0, "changed": 0})   # how each pass decided


def _ports_to_decide(snapshot, result, trouble: dict, kept: PortStatuses | None):
    """The ports whose status may differ from the one `kept` holds: those the model changed (their
    node's port numbers included) and those whose switches changed (`result.needs_changed`,
    owners); every port (None) when the switches in trouble or the refused owners changed, or
    what changed is not known."""
    changed = getattr(result, "needs_changed", None)
    if kept is None or kept.model is None or changed is None or trouble != kept.trouble \
            or result.refused != kept.refused:
        return None
    delta = changes(kept.model, snapshot)
    if delta is None:
        return None
    ids = set(delta.ports) | {obj for kind, obj in changed if kind in FLOW_KINDS["port"]}
    for port_id in ids:
        kept.statuses.pop(("port", port_id), None)
    by_id = ports_by_id(snapshot, getattr(result, "views", None))
    return [by_id[i] for i in ids if i in by_id]


def app_problems(snapshot, agents, apps=None, views=None) -> dict[tuple[str, int], list]:
    """(kind, id) -> the problems (fathom.model.status.Problem) the apps' `status` found with it."""
    out = defaultdict(list)
    for app in apps or registry():
        if app.status is not None:
            for problem in app.status(snapshot, agents, views):
                out[problem.about].append(problem)
    return out


def with_problems(said, flows) -> Status:
    """An object's status from its apps' problems (`said`) and, unless one of those replaces it, what
    the switches say of its flows (`flows()`); a warning shows while the object is active."""
    replacing = [p.status for p in said if p.replaces_flows and p.severity is not Severity.WARNING]
    got = worst(replacing) if replacing else flows()
    beside = [p.status for p in said if not p.replaces_flows and p.severity is not Severity.WARNING]
    if beside:
        got = worst([got, *beside])
    warnings = [p.reason for p in said if p.severity is Severity.WARNING]
    if warnings and got[0] == "active":
        got = ("active", "; ".join(warnings))
    return got


def decide(snapshot, result, kept: PortStatuses | None = None, apps=None) -> dict[tuple[str, int], Status]:
    """(kind, id) -> (status, reason) of every object in the model (node, fabric_switch, network,
    subnet, port, router, router_interface, tap_policy); and ("subnet_dhcp", subnet id) -> the
    subnet's DHCP servers per node, ((node, status, reason), ...). `kept`: the ports' statuses the
    pass before decided, updated here (only the ports a change reached are decided again). `apps`:
    whose problems count (fathom.apps.registry())."""
    needs = getattr(result, "needs", None)
    if needs is None:
        needs = owners_needed(result.desired)
    # the switches with something to say (usually none): an object none of whose switches is among
    # them is active without looking at each (a port's flows may be on every switch of the fabric)
    trouble = {k: p for k in set(result.desired) | set(result.switches)
               if (p := switch_problem(result.switches.get(k))) is not None}
    ports = _ports_to_decide(snapshot, result, trouble, kept)
    port_statuses = kept.statuses if kept is not None else {}
    if ports is None:
        ports = snapshot.ports
        port_statuses.clear()
    troubled = set(trouble)
    refused_any = bool(result.refused)

    def from_flows(kind: str, obj_id: int, home=None) -> Status | None:
        """From the flows alone; None when no switch needs any. `home(key)`: whether the switch's
        own trouble counts for the object wherever else its flows are (None: the object has no
        home; a switch's own trouble counts when no switch holding its flows is healthy)."""
        if refused_any:
            refused = [result.refused[(k, obj_id)] for k in FLOW_KINDS[kind] if (k, obj_id) in result.refused]
            if refused:
                return "error", "; ".join(refused)
        held = [keys for k in FLOW_KINDS[kind] if (keys := needs.get((k, obj_id)))]
        if not held:
            return None
        if not troubled or all(keys.isdisjoint(troubled) for keys in held):
            return "active", None
        # only the switches in trouble are looked at: an object's flows may be on every switch of
        # the fabric, and one node down must not cost every pass a look at each
        bad = set().union(*(keys & troubled for keys in held))
        healthy_somewhere = not all(keys <= troubled for keys in held)
        counted = [p[:2] for k in bad
                   if not (p := trouble[k])[2] or (home(k) if home else not healthy_somewhere)]
        return worst(counted)

    out: dict[tuple[str, int], Status] = {}
    for n in snapshot.nodes:
        res = result.switches.get(SwitchKey(BR_INT, n.name))
        if res is None:
            continue
        if res.setup == "error":
            out[("node", n.id)] = ("error", res.reason)
        elif res.setup == "checking":
            out[("node", n.id)] = ("pending", res.reason)
        elif res.state == "ok":
            out[("node", n.id)] = ("active", None)
        elif res.state.startswith("lost"):
            out[("node", n.id)] = ("error", res.state.removeprefix("lost: "))
        elif res.state.startswith("error"):
            out[("node", n.id)] = ("error", res.state)
        elif res.state.startswith("not answering"):
            out[("node", n.id)] = ("pending", f"br-int {res.state}")
        else:
            out[("node", n.id)] = ("pending", "waiting for br-int to connect over OpenFlow")
    for s in (snapshot.fabric.switches if snapshot.fabric else ()):
        res = result.switches.get(SwitchKey(FABRIC_SWITCH, s.name))
        if res is None:
            continue
        if res.setup == "error":
            out[("fabric_switch", s.id)] = ("error", res.reason)
        elif res.state == "ok":
            out[("fabric_switch", s.id)] = ("active", None)
        elif res.state.startswith("lost"):
            out[("fabric_switch", s.id)] = ("error", res.state.removeprefix("lost: "))
        elif res.state.startswith("error"):
            out[("fabric_switch", s.id)] = ("error", f"apply failed: {res.state.removeprefix('error: ')}")
        elif res.state.startswith("not answering"):
            out[("fabric_switch", s.id)] = ("pending", res.state)
        else:
            out[("fabric_switch", s.id)] = ("pending", "waiting for the switch to connect over OpenFlow")

    for net in snapshot.networks:
        out[("network", net.id)] = from_flows("network", net.id) or ("active", None)
    for sub in snapshot.subnets:
        out[("subnet", sub.id)] = out.get(("network", sub.network_id), ("active", None))
        # the DHCP servers' own statuses, per node: never the network's (a silent agent stops
        # DHCP on its node, not forwarding), shown on the subnet (docs/dhcp.md)
        out[("subnet_dhcp", sub.id)] = result.dhcp_servers.get(sub.network_id, ()) if sub.enable_dhcp else ()
    nodes = {n.name: n for n in snapshot.nodes}
    for p in ports:
        got = from_flows("port", p.id, p.node and (lambda k, node=p.node: k.name == node and k.bridge in HOST_BRIDGES))
        if got is not None and got[0] == "error":
            pass
        elif p.node is None:
            got = ("down", "not bound to a node")
        elif not p.interface:
            got = ("down", f"no interface named on node {p.node}")
        elif p.node in nodes and nodes[p.node].ofport(p.interface) is None:
            # OVSDB: no interface of that name with an OpenFlow port on the node's br-int
            got = ("down", f"interface {p.interface!r} is not plugged on node {p.node}")
        elif got is None:
            got = ("pending", f"waiting for interface {p.interface!r} on node {p.node}")
        port_statuses[("port", p.id)] = got
    out.update(port_statuses)
    if kept is not None:     # every port it holds decided with these: the next pass starts from here
        kept.model, kept.trouble, kept.refused = snapshot, trouble, dict(result.refused)
        kept.passes["whole" if ports is snapshot.ports else "changed"] += 1
    interfaces = defaultdict(list)
    modes = effective_modes(snapshot)
    fabric_keys = {SwitchKey(FABRIC_SWITCH, s.name) for s in (snapshot.fabric.switches if snapshot.fabric else ())}
    for ri in snapshot.router_interfaces:
        routed_by_fabric = ri.router_id in modes and modes[ri.router_id].mode == "fabric"
        out[("router_interface", ri.id)] = from_flows("router_interface", ri.id,
                                                      fabric_keys.__contains__ if routed_by_fabric and fabric_keys else None) or ("active", None)
        interfaces[ri.router_id].append(out[("router_interface", ri.id)])
    for (kind, obj_id), st in result.agents.items():
        if kind == "pptmon_attachment":
            out[(kind, obj_id)] = st
    problems = app_problems(snapshot, result.agents, apps, getattr(result, "views", None))

    def status_of(kind: str, obj_id: int) -> Status:
        """An object with flows: its apps' problems, its flows, or `active` when it needs none."""
        return with_problems(problems.get((kind, obj_id), ()),
                             lambda: from_flows(kind, obj_id) or ("active", None))

    gateways = {gw.router_id: [status_of("router_gateway", gw.router_id)] for gw in snapshot.router_gateways}
    for r in snapshot.routers:
        agent = result.agents.get(("router", r.id))
        if agent is not None and agent[0] != "active":
            out[("router", r.id)] = agent
        else:
            out[("router", r.id)] = worst(interfaces.get(r.id, []) + gateways.get(r.id, []))
    for f in snapshot.floating_ips:
        if f.port_id is None:
            out[("floating_ip", f.id)] = ("active", None)
        elif f.router_id in gateways and gateways[f.router_id][0][0] != "active":
            out[("floating_ip", f.id)] = gateways[f.router_id][0]
        else:
            out[("floating_ip", f.id)] = from_flows("floating_ip", f.id) or (
                "pending", "waiting for the port's router to route it on its gateway node")
    # the ports holding a gateway's or floating IP's address have no flows of their own: their owner's status
    for gw in snapshot.router_gateways:
        if gw.address_port_id:
            out[("port", gw.address_port_id)] = gateways[gw.router_id][0]
    for f in snapshot.floating_ips:
        if f.address_port_id:
            out[("port", f.address_port_id)] = out[("floating_ip", f.id)]

    for t in snapshot.tap_policies:
        out[("tap_policy", t.id)] = status_of("tap_policy", t.id)

    rules = defaultdict(list)
    for r in snapshot.security_group_rules:
        rules[r.group_id].append(r.id)
    for g in snapshot.security_groups:
        parts = [from_flows("security_group", g.id)] + [from_flows("security_group_rule", r) for r in rules[g.id]]
        out[("security_group", g.id)] = worst([p for p in parts if p is not None])
    _chains(snapshot, out, status_of)
    return out


def hostlocal(desired: dict[str, list], agents: dict, now: float, stale_after: float,
              digest_of=None) -> dict[tuple[str, int], Status]:
    """(owner kind, id) -> status of every object the nodes' agents must hold.

    `desired`: node -> host-local objects (fathom.model.hostlocal_desired); `agents`: node -> what its agent
    last reported (fathom.store.agents.AgentView), whose objects say per owner the status and the
    digest of the object the agent applied: an agent still holding an older version of an object is
    `pending`. `digest_of(obj)`: digest([obj]) (fathom.model.hostlocal.Digests remembers them).
    Pure."""
    out: dict[tuple[str, int], Status] = {}
    for node, objects in desired.items():
        view = agents.get(node)
        for obj in objects:
            kind, obj_id = obj.owner
            st = held(node, view, obj, now, stale_after, digest_of)
            prev = out.get((kind, obj_id))
            out[(kind, obj_id)] = st if prev is None else worst([prev, st])
    return out


def dhcp_servers(desired: dict[str, list], agents: dict, now: float, stale_after: float,
                 digest_of=None) -> dict[int, tuple[tuple[str, str, str | None], ...]]:
    """network id -> ((node, status, reason), ...) of its DHCP server on each node that must run
    one (fathom.model.hostlocal.DhcpServer), by node name. Pure."""
    from fathom.model.hostlocal import DhcpServer
    out: dict[int, list] = {}
    for node, objects in sorted(desired.items()):
        for obj in objects:
            if isinstance(obj, DhcpServer):
                out.setdefault(obj.network_id, []).append(
                    (node, *held(node, agents.get(node), obj, now, stale_after, digest_of)))
    return {nid: tuple(rows) for nid, rows in out.items()}


def held(node: str, view, obj, now: float, stale_after: float, digest_of=None) -> Status:
    """The status of one host-local object on `node` from its agent's last report (`view`); an
    agent that applied the object but waits for something on its host says why (`pending`)."""
    from fathom.model.hostlocal import digest, owner_key
    said = view.objects.get(owner_key(obj.owner)) if view is not None else None
    if view is None or view.reported_at is None:
        return ("error", f"no agent on node {node} has reported (is `fathom agent run` running there?)")
    if now - view.reported_at > stale_after:
        return ("error", f"agent on node {node} not reporting since "
                         f"{time.strftime('%H:%M:%S', time.localtime(view.reported_at))}")
    if said is not None and said.get("status") == "error":
        return ("error", f"node {node}: {said.get('reason') or 'failed'}")
    applied = said is not None and said.get("applied") == (digest_of(obj) if digest_of else digest([obj]))
    if applied and said.get("status") == "pending" and said.get("reason"):
        return ("pending", f"node {node}: {said['reason']}")
    if not applied or said.get("status") != "active":
        return ("pending", f"waiting for the agent on node {node}")
    return ("active", None)


def _chains(snapshot, out: dict, status_of) -> None:
    """Port chains from their flows and their app's problems; pairs, groups and classifiers from
    the ports they name."""
    def ports(*ids) -> Status:
        return worst([out.get(("port", i), ("error", f"port {i} was deleted")) for i in ids if i is not None])

    for pair in snapshot.port_pairs:
        out[("port_pair", pair.id)] = ports(pair.ingress_port_id, pair.egress_port_id)
    for group in snapshot.port_pair_groups:
        out[("port_pair_group", group.id)] = worst([out[("port_pair", i)] for i in group.port_pair_ids
                                                     if ("port_pair", i) in out])
    for fc in snapshot.flow_classifiers:
        out[("flow_classifier", fc.id)] = ports(fc.logical_source_port_id, fc.logical_destination_port_id)
    for chain in snapshot.port_chains:
        out[("port_chain", chain.id)] = status_of("port_chain", chain.id)


def node_states(result) -> dict[str, str]:
    """node name -> bootstrap state (complete | device_created | error) for the store's `state`."""
    out = {}
    for key, res in result.switches.items():
        if key.bridge == BR_INT:
            out[key.name] = "error" if res.setup == "error" else "complete" if res.state == "ok" else "device_created"
    return out


def write(session_factory, snapshot, result) -> None:
    from fathom.store.status import write_statuses
    with session_factory() as session, session.begin():
        write_statuses(session, decide(snapshot, result), node_states(result))
