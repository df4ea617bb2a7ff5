"""Store operations of vTAP policies: identifier resolution, ownership, filter and overlap checks.

Like fathom/store/ops.py, each check raises a fathom.store.errors error naming the request field.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Collection

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from fathom.model import taps as vtap
from fathom.store import models as m
from fathom.store.errors import Conflict, Invalid, NotFound
from fathom.store.ops import Caller, _external_id, _owner, valid_id
from fathom.store.snapshot import load_tap_view

DIRECTIONS = ("forward", "both")
ROLES = ("sender", "receiver", "monitor", "monitor2")


def get_tap(session: Session, caller: Caller, tap_id: int) -> m.TapPolicy:
    tap = session.get(m.TapPolicy, tap_id) if valid_id(tap_id) else None
    if tap is None or not (caller.admin or tap.project_id == caller.project):
        raise NotFound(f"tap policy {tap_id} does not exist")
    return tap


def _visible(caller: Caller, port: m.Port) -> bool:
    return caller.admin or port.project_id == caller.project


def resolve(session: Session, caller: Caller, ref, field: str, *, must_be_port: bool):
    """A port (by id, name, or MAC+IP) -> m.Port; or, when allowed, a bare (mac, ip) -> tuple."""
    if isinstance(ref, int) or (isinstance(ref, str) and ref.isascii() and ref.isdigit()):
        # another project's port is as absent as a missing one (same answer)
        port = session.get(m.Port, int(ref)) if valid_id(int(ref)) else None
        if port is None or port.router_id is not None or not _visible(caller, port):
            raise NotFound(f"port {ref} does not exist", field)
        return port
    if isinstance(ref, str):
        found = session.scalars(select(m.Port).where(m.Port.name == ref, m.Port.router_id.is_(None))
                                .order_by(m.Port.id)).all()
        found = [p for p in found if _visible(caller, p)]
        if not found:
            raise NotFound(f"no port named {ref[:64]!r}", field)
        if len(found) > 1:
            raise Invalid(f"{len(found)} ports are named {ref[:64]!r} (ids "
                          f"{', '.join(str(p.id) for p in found)}): use an id", field)
        return found[0]
    mac, ip = ref["mac"], ref["ip"]
    candidates = session.scalars(select(m.Port).where(m.Port.mac_address == mac,
                                                      m.Port.router_id.is_(None))).all()
    for port in candidates:
        if any(a.ip_address == ip for a in port.fixed_ips) and _visible(caller, port):
            return port
    if must_be_port:
        raise Invalid(f"no port has MAC {mac} and IP {ip}: the {field} must be a port fathom knows "
                      f"(its edge switch is where the tap goes)", field)
    return (mac, ip)


def _identity(port: m.Port) -> tuple[str, str | None]:
    return port.mac_address, port.fixed_ips[0].ip_address if port.fixed_ips else None


def create_tap(session: Session, caller: Caller, body: dict) -> m.TapPolicy:
    project = _owner(caller, body.get("project_id"))
    tap = m.TapPolicy(name=body.get("name") or "", project_id=project, status="pending",
                      direction="forward", priority=100, filters={}, has_monitor2=False,
                      external_id=_external_id(session, caller, m.TapPolicy, body.get("external_id")))
    _apply(session, caller, tap, body, creating=True)
    session.add(tap)
    session.flush()
    _check_overlap(session, tap)
    judge(session, [tap.id], changed=True)
    return tap


def update_tap(session: Session, caller: Caller, tap_id: int, changes: dict) -> m.TapPolicy:
    tap = get_tap(session, caller, tap_id)
    _apply(session, caller, tap, changes, creating=False)
    session.flush()
    _check_overlap(session, tap)
    judge(session, [tap.id], changed=True)
    return tap


def delete_tap(session: Session, caller: Caller, tap_id: int) -> None:
    session.delete(get_tap(session, caller, tap_id))
    session.flush()


def _apply(session: Session, caller: Caller, tap: m.TapPolicy, body: dict, creating: bool) -> None:
    if creating:
        for role in ("sender", "receiver", "monitor"):
            if body.get(role) is None:
                raise Invalid(f"{role} is required", role)
    if "name" in body and body["name"] is not None:
        tap.name = body["name"]
    if body.get("sender") == vtap.ANY:
        tap.sender_port_id, tap.sender_is_port = None, False
    elif body.get("sender") is not None:
        tap.sender_port_id = resolve(session, caller, body["sender"], "sender", must_be_port=True).id
        tap.sender_is_port = True
    if body.get("receiver") == vtap.ANY:
        tap.receiver_port_id, tap.receiver_is_port = None, False
        tap.receiver_mac = tap.receiver_ip = vtap.ANY
    elif body.get("receiver") is not None:
        r = resolve(session, caller, body["receiver"], "receiver", must_be_port=False)
        if isinstance(r, m.Port):
            tap.receiver_port_id, tap.receiver_is_port = r.id, True
            tap.receiver_mac, ip = _identity(r)
            if ip is None:
                raise Invalid(f"port {r.id} has no IP address", "receiver")
            tap.receiver_ip = ip
        else:
            tap.receiver_port_id, tap.receiver_is_port = None, False
            tap.receiver_mac, tap.receiver_ip = r
    if body.get("monitor") is not None:
        tap.monitor_port_id = resolve(session, caller, body["monitor"], "monitor", must_be_port=True).id
    if "monitor2" in body:
        if body["monitor2"] is None:
            tap.monitor2_port_id, tap.has_monitor2 = None, False
        else:
            tap.monitor2_port_id = resolve(session, caller, body["monitor2"], "monitor2", must_be_port=True).id
            tap.has_monitor2 = True
    if body.get("direction") is not None:
        if body["direction"] not in DIRECTIONS:
            raise Invalid(f"direction is one of {', '.join(DIRECTIONS)}", "direction")
        tap.direction = body["direction"]
    if body.get("priority") is not None:
        if not 0 <= body["priority"] <= vtap.MAX_PRIORITY:
            raise Invalid(f"priority is 0..{vtap.MAX_PRIORITY}", "priority")
        tap.priority = body["priority"]
    if "truncate" in body:
        n = body["truncate"] or None
        if n is not None and not vtap.MIN_TRUNCATE <= n <= 65535:
            raise Invalid(f"truncate is {vtap.MIN_TRUNCATE}..65535 bytes (or null: whole frames)", "truncate")
        tap.truncate = n
    if "rate_pps" in body:
        n = body["rate_pps"] or None
        if n is not None and not 1 <= n <= 10_000_000:
            raise Invalid("rate_pps is 1..10000000 copies per second (or null: no limit)", "rate_pps")
        tap.rate_pps = n
    filter_keys = ("ip_proto", "vlan", "tp_src", "tp_dst", "match")
    if any(k in body for k in filter_keys):
        current = dict(tap.filters or {})
        old = {k: current.pop(k) for k in ("ip_proto", "vlan", "tp_src", "tp_dst") if k in current}
        merged = {**old, "match": current}
        for k in filter_keys:
            if k in body:
                merged[k] = body[k]
        try:
            tap.filters = vtap.normalise_filters(**merged)
        except vtap.FilterError as e:
            raise Invalid(e.message, e.field) from None
    _check_roles(session, tap)


def _check_roles(session: Session, tap: m.TapPolicy) -> None:
    if tap.monitor_port_id is not None and tap.monitor_port_id == tap.sender_port_id:
        raise Invalid("the monitor cannot be the sender", "monitor")
    if tap.receiver_is_port and tap.monitor_port_id is not None and tap.monitor_port_id == tap.receiver_port_id:
        raise Invalid("the monitor cannot be the receiver", "monitor")
    if tap.receiver_is_port and tap.receiver_port_id is not None and tap.receiver_port_id == tap.sender_port_id:
        raise Invalid("the receiver cannot be the sender", "receiver")
    if tap.has_monitor2:
        if tap.monitor2_port_id in (tap.sender_port_id, tap.monitor_port_id) or (
                tap.receiver_is_port and tap.monitor2_port_id == tap.receiver_port_id):
            raise Invalid("monitor2 must differ from the sender, the receiver and the monitor", "monitor2")
    if not tap.sender_is_port and not tap.receiver_is_port:
        raise Invalid("with a sender of * the tap is at the receiver's edge: the receiver must be a port",
                      "receiver")
    if tap.direction == "both" and not tap.receiver_is_port and tap.receiver_mac != vtap.ANY:
        raise Invalid("direction both taps the receiver's edge too: the receiver must be a port or *",
                      "direction")
    try:
        if tap.receiver_ip != vtap.ANY:
            ipaddress.IPv4Address(tap.receiver_ip)
    except ValueError:
        raise Invalid(f"{tap.receiver_ip!r} is not an IPv4 address", "receiver.ip") from None


def _check_overlap(session: Session, tap: m.TapPolicy) -> None:
    others = vtap.conflicting_policies(load_tap_view(session, routes=True), tap.id)
    if others:
        raise Conflict(f"the policy overlaps policy {', '.join(map(str, others))} at the same priority "
                       f"{tap.priority}: give one of them another priority (the higher one copies the "
                       f"overlapping packets)", "priority")


def static_problems(session: Session, policies: Collection[int]) -> dict[int, vtap.Problems]:
    """Why each policy of these ids cannot be installed, judged from the store alone
    (every bound interface is assumed present on its node): deleted ports (fatal) and unbound ports."""
    return vtap.static_problems(load_tap_view(session, policies=policies))


WAITING = "waiting for the switches to hold it"


def judge(session: Session, policies: Collection[int], changed: bool = False) -> None:
    """Write what the store alone tells of the policies of these ids: a problem (a port deleted or
    unbound under one, a marker a tenant network uses) is the policy's status at once, until the
    controller's next pass decides it again (from the same problems, fathom.apps.vtap). A policy
    without one keeps the status the controller wrote last; one just made or `changed` waits for
    the switches. The one status a policy has: every reader reads it."""
    if not policies:
        return
    judged = static_problems(session, policies)
    for tap in session.scalars(select(m.TapPolicy).where(m.TapPolicy.id.in_(list(policies)))):
        problems = judged.get(tap.id)
        if problems:
            tap.status, tap.status_reason = problems.severity.value, "; ".join(problems)
        elif changed:
            tap.status, tap.status_reason = "pending", WAITING


def policies_naming(session: Session, port_id: int) -> list[int]:
    """The ids of the policies that name a port (as sender, receiver or a monitor)."""
    t = m.TapPolicy
    cols = (t.sender_port_id, t.receiver_port_id, t.monitor_port_id, t.monitor2_port_id)
    return list(session.scalars(select(t.id).where(or_(*(c == port_id for c in cols)))))
