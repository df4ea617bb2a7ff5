"""Security groups and rules: Neutron's callbacks -> the journal (ML2 has no mechanism-driver hooks
for them; networking-odl subscribes the same way). Subscribed once, by the ML2 driver.

Each precommit callback writes its entry in Neutron's transaction; the after-commit ones wake the
journal thread. A new group comes with its rules (Neutron's default rules, or the default group's):
each is an entry of its own. Deleting a group deletes its rules in fathom too.
"""
from __future__ import annotations

from neutron_lib.callbacks import events, registry, resources

from neutron.objects import securitygroup as sg_obj

from . import db
from .journal import Journal

_subscribed = False


def subscribe() -> None:
    global _subscribed
    if _subscribed:
        return
    _subscribed = True
    registry.subscribe(_group_set, resources.SECURITY_GROUP, events.PRECOMMIT_CREATE)
    registry.subscribe(_group_updated, resources.SECURITY_GROUP, events.PRECOMMIT_UPDATE)
    registry.subscribe(_group_deleted, resources.SECURITY_GROUP, events.PRECOMMIT_DELETE)
    registry.subscribe(_rule_created, resources.SECURITY_GROUP_RULE, events.PRECOMMIT_CREATE)
    registry.subscribe(_rule_deleted, resources.SECURITY_GROUP_RULE, events.PRECOMMIT_DELETE)
    for resource in (resources.SECURITY_GROUP, resources.SECURITY_GROUP_RULE):
        for event in (events.AFTER_CREATE, events.AFTER_UPDATE, events.AFTER_DELETE):
            registry.subscribe(_wake, resource, event)


def _group(sg: dict) -> dict:
    return {k: sg.get(k) for k in ("id", "name", "description", "project_id")}


def _group_set(resource, event, trigger, payload):
    sg = payload.latest_state
    db.record(payload.context, "security_group", "set", _group(sg))
    for rule in sg.get("security_group_rules") or []:
        db.record(payload.context, "security_group_rule", "set", dict(rule))


def _group_updated(resource, event, trigger, payload):
    db.record(payload.context, "security_group", "set", _group(payload.desired_state))


def _group_deleted(resource, event, trigger, payload):
    sg = payload.latest_state
    db.record(payload.context, "security_group", "delete", {"id": sg["id"], "project_id": sg.get("project_id")})


def _rule_created(resource, event, trigger, payload):
    db.record(payload.context, "security_group_rule", "set", dict(payload.latest_state))


def _rule_deleted(resource, event, trigger, payload):
    rule = sg_obj.SecurityGroupRule.get_object(payload.context, id=payload.resource_id)
    db.record(payload.context, "security_group_rule", "delete",
              {"id": payload.resource_id, "project_id": rule.project_id if rule else None})


def _wake(resource, event, trigger, payload):
    Journal.get().wake()
