"""Full sync: make fathom hold exactly what Neutron holds, in both directions.

Run by the journal thread at start and every `[fathom] sync_interval` seconds, right after a replay
pass that reached fathom (the same thread: never concurrently with the replay). Neutron is read
first, then fathom:

1. fathom objects a driver made (they carry an external_id) whose Neutron object is gone, or is no
   longer of that kind, are deleted, last kind first (interfaces, ports, routers, subnets, networks);
2. every Neutron object is applied as a journal `set` would (created, updated, replaced, or left
   alone when equal), first kind first;
3. port status: a bound port fathom reports active is completed in Neutron (ACTIVE), one fathom
   does not (VIF gone, node lost) is set DOWN in Neutron and watched until it is active again.

fathom is read per project (the service identity acts for one project at a time): the projects of
Neutron's objects and those the journal has named.
"""
from __future__ import annotations

from neutron_lib import constants as n_const
from neutron_lib.callbacks import resources as cb_resources
from neutron_lib.plugins import directory
from oslo_log import log as logging

from neutron.db import provisioning_blocks

from . import db
from .client import FathomError
from .resources import MAPPINGS, Refs, Unmapped, apply_set, project_of
from .resources.port import bound_host

LOG = logging.getLogger(__name__)


def full_sync(api, ctx, journal=None) -> dict:
    neutron = {m.kind: m.neutron_objects(ctx) for m in MAPPINGS}
    projects = {project_of(o) for objs in neutron.values() for o in objs} | db.projects(ctx)
    projects.discard(None)
    fathom: dict[tuple[str, str], tuple[dict, str]] = {}
    for project in sorted(projects):
        for m in MAPPINGS:
            for o in m.fathom_objects(api, project):
                fathom[(m.kind, o["external_id"])] = (o, project)
    report = {"deleted": 0, "created": 0, "updated": 0, "replaced": 0, "in sync": 0, "refused": 0,
              "ports_activated": 0, "ports_down": 0}

    for m in reversed(MAPPINGS):
        alive = {o["id"] for o in neutron[m.kind] if _wanted_kind(m, o)}
        for (kind, uuid), (o, project) in list(fathom.items()):
            if kind == m.kind and uuid not in alive:
                try:
                    m.delete(api, o, project)
                    report["deleted"] += 1
                    LOG.warning("fathom sync: deleted %s %s (not in Neutron)", kind, uuid)
                except FathomError as e:
                    report["refused"] += 1
                    LOG.error("fathom sync: cannot delete %s %s: %s", kind, uuid, e)
                del fathom[(kind, uuid)]

    refs: dict[str | None, Refs] = {}
    for m in MAPPINGS:
        for obj in neutron[m.kind]:
            project = project_of(obj)
            existing = fathom.get((m.kind, obj["id"]), (None,))[0]
            try:
                what = apply_set(api, m, obj, refs.setdefault(project, Refs(api, project)), existing)
            except (FathomError, Unmapped) as e:
                report["refused"] += 1
                LOG.error("fathom sync: %s %s refused: %s", m.kind, obj["id"], e)
                continue
            key = what.split(" (")[0]
            if key in report:
                report[key] += 1
            if what not in ("in sync", "not mapped"):
                LOG.warning("fathom sync: %s %s %s (drift repaired)", m.kind, obj["id"], what)

    plugin = directory.get_plugin()
    for port in neutron["port"]:
        if not bound_host(port) or (port.get("device_owner") or "").startswith("network:"):
            continue
        mine = fathom.get(("port", port["id"]), (None,))[0]
        active = mine is not None and mine["status"] == "active"
        if active and port["status"] != n_const.PORT_STATUS_ACTIVE:
            provisioning_blocks.provisioning_complete(ctx, port["id"], cb_resources.PORT,
                                                      provisioning_blocks.L2_AGENT_ENTITY)
            report["ports_activated"] += 1
        elif not active and port["status"] == n_const.PORT_STATUS_ACTIVE:
            plugin.update_port_status(ctx, port["id"], n_const.PORT_STATUS_DOWN)
            report["ports_down"] += 1
        if not active and journal is not None:
            journal.watch[port["id"]] = project_of(port)
    LOG.info("fathom full sync: %s", report)
    return report


def _wanted_kind(m, obj) -> bool:
    """Whether this Neutron object is of the mapping's kind (a port may be a router interface)."""
    try:
        return m.wanted(obj, _NoRefs()) is not None
    except Unmapped:
        return True


class _NoRefs:
    def id(self, collection, uuid):
        return 0
