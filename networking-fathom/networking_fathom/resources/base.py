"""How one kind of Neutron object maps onto a fathom object (the base of every module here).

A mapping turns a Neutron object (a dict, as the plugin returns it) into the body fathom should
hold for it (`wanted`), keyed by Neutron's UUID in fathom's `external_id`. Replaying a journal entry
or a full sync both go through `apply_set` / `apply_delete` below, which make fathom's object equal
to the wanted body: create it, PATCH what may change, or delete and create it again when a field
fathom cannot change (e.g. a port's addresses) differs.
"""
from __future__ import annotations

import ipaddress


class Unmapped(Exception):
    """The object references one that fathom does not hold (not mapped, or not created yet)."""


class Refs:
    """Neutron UUID -> fathom id of referenced objects, looked up by external_id (cached per pass)."""

    def __init__(self, api, project: str | None):
        self.api, self.project = api, project
        self.cache: dict[tuple[str, str], int] = {}

    def id(self, collection: str, uuid: str) -> int:
        key = (collection, uuid)
        if key not in self.cache:
            found = self.api.by_external_id(collection, uuid, self.project)
            if found is None:
                raise Unmapped(f"{collection[:-1]} {uuid} is not in fathom")
            self.cache[key] = found["id"]
        return self.cache[key]


class Mapping:
    kind = ""                 # the journal's object_type
    collection = ""           # fathom's collection, e.g. "networks"
    order = 0                 # creation order in a full sync (deletion runs in reverse)
    immutable: tuple = ()     # fields fathom cannot change in place (delete + create)
    mutable: tuple = ("name",)

    # ---- what the driver implements per kind
    def wanted(self, obj: dict, refs: Refs) -> dict | None:
        """fathom's body for this Neutron object; None when fathom does not hold such objects."""
        raise NotImplementedError

    def neutron_objects(self, context) -> list[dict]:
        """Every Neutron object of this kind (the full sync's view of Neutron), as `wanted` takes them."""
        raise NotImplementedError

    def is_mine(self, fathom_obj: dict) -> bool:
        """Whether a fathom object of `collection` is of this kind (ports hold two kinds)."""
        return True

    def current(self, fathom_obj: dict) -> dict:
        """fathom's object in the shape of `wanted`'s body, for comparison."""
        return fathom_obj

    # ---- fathom's REST calls (override where a kind is not a plain collection)
    def create(self, api, body: dict, project: str | None) -> dict:
        return api.request("POST", f"/{self.collection}", project, json=body)

    def update(self, api, existing: dict, changes: dict, project: str | None) -> dict:
        return api.request("PATCH", f"/{self.collection}/{existing['id']}", project, json=changes)

    def delete(self, api, existing: dict, project: str | None) -> None:
        api.request("DELETE", f"/{self.collection}/{existing['id']}", project)

    def find(self, api, uuid: str, project: str | None) -> dict | None:
        found = api.by_external_id(self.collection, uuid, project)
        return found if found is not None and self.is_mine(found) else None

    def fathom_objects(self, api, project: str | None) -> list[dict]:
        """fathom's objects of this kind that a driver made (they have an external_id)."""
        return [o for o in api.list(f"/{self.collection}", project) if o.get("external_id") and self.is_mine(o)]


def project_of(obj: dict) -> str | None:
    return obj.get("project_id") or obj.get("tenant_id") or None


def apply_set(api, mapping: Mapping, obj: dict, refs: Refs, existing=...) -> str:
    """Make fathom hold `obj` as `mapping` says; what was done ("created", "updated", ...)."""
    project = project_of(obj)
    body = mapping.wanted(obj, refs)     # Unmapped: a referenced object is missing; retried later
    if existing is ...:
        existing = mapping.find(api, obj["id"], project)
    if body is None:
        if existing is not None:
            mapping.delete(api, existing, project)
            return "deleted (not mapped)"
        return "not mapped"
    if existing is None:
        mapping.create(api, body, project)
        return "created"
    now = mapping.current(existing)
    if any(_norm(now.get(k)) != _norm(body.get(k)) for k in mapping.immutable):
        mapping.delete(api, existing, project)
        mapping.create(api, body, project)
        return "replaced"
    changes = {k: body[k] for k in mapping.mutable if k in body and _norm(now.get(k)) != _norm(body[k])}
    if changes:
        mapping.update(api, existing, changes, project)
        return "updated"
    return "in sync"


def apply_delete(api, mapping: Mapping, uuid: str, project: str | None, existing=...) -> str:
    if existing is ...:
        existing = mapping.find(api, uuid, project)
    if existing is None:
        return "absent"
    mapping.delete(api, existing, project)
    return "deleted"


def _norm(value):
    """Comparable values: lists of dicts in a stable order, addresses as strings."""
    if isinstance(value, list):
        return sorted((_norm(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in sorted(value.items())}
    if isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv4Network)):
        return str(value)
    return value


def ipv4(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).version == 4
    except ValueError:
        return False
