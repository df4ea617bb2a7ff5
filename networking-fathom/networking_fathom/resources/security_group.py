"""Neutron security groups and rules -> fathom's (docs/security-groups.md: the same semantics).

A group maps to a group, a rule to a rule, each keyed by Neutron's UUID. Each project has one
default group on both sides (made on first use by each): Neutron's `default` group adopts fathom's
(the driver gives it Neutron's UUID) and replaces the rules fathom made in it by Neutron's own, so
a group Neutron drives holds exactly Neutron's rules. Rules are never changed, only created and
deleted (as in Neutron): a rule that differs is replaced.
"""
from __future__ import annotations

from neutron_lib.plugins import directory

from .base import Mapping

DEFAULT = "default"
# protocol names as Neutron and fathom spell them -> IP protocol numbers (a rule compares by number)
PROTOCOLS = {"icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "gre": 47, "esp": 50, "ah": 51, "icmpv6": 58,
             "ipv6-icmp": 58, "ospf": 89, "pim": 103, "vrrp": 112, "sctp": 132, "udplite": 136}


def protocol_number(value):
    """A rule's protocol as a number (None: any); names fathom does not know are passed as given."""
    if value in (None, "", "any"):
        return None
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    return PROTOCOLS.get(str(value).lower(), value)


class SecurityGroup(Mapping):
    kind = "security_group"
    collection = "security-groups"
    order = 1.5
    mutable = ("name", "description")

    def wanted(self, obj, refs):
        body = {"name": (obj.get("name") or "")[:255], "description": (obj.get("description") or "")[:255],
                "external_id": obj["id"]}
        return body

    def create(self, api, body, project):
        if body["name"] != DEFAULT:
            return api.request("POST", f"/{self.collection}", project, json=body)
        # fathom made the project's default group already (listing groups makes it): adopt it
        group = api.request("GET", f"/{self.collection}", project, params={"name": DEFAULT})[0]
        api.request("PATCH", f"/{self.collection}/{group['id']}", project,
                    json={"external_id": body["external_id"], "description": body["description"]})
        for rule in group["rules"]:
            if not rule.get("external_id"):
                api.request("DELETE", f"/security-group-rules/{rule['id']}", project)
        return group

    def update(self, api, existing, changes, project):
        if existing["name"] == DEFAULT:
            changes = {k: v for k, v in changes.items() if k != "name"}    # neither side renames it
            if not changes:
                return existing
        return super().update(api, existing, changes, project)

    def delete(self, api, existing, project):
        if existing["name"] == DEFAULT:
            # fathom keeps a project's default group (Neutron deletes it with the project): let it go
            # back to fathom's own
            api.request("PATCH", f"/{self.collection}/{existing['id']}", project, json={"description": ""})
            return
        super().delete(api, existing, project)

    def fathom_objects(self, api, project):
        return [o for o in api.list(f"/{self.collection}", project) if o.get("external_id")]

    def neutron_objects(self, context):
        return directory.get_plugin().get_security_groups(context)


class SecurityGroupRule(Mapping):
    kind = "security_group_rule"
    collection = "security-group-rules"
    order = 1.6
    immutable = ("security_group_id", "direction", "ethertype", "protocol", "port_range_min", "port_range_max",
                 "remote_ip_prefix", "remote_group_id")
    mutable = ()

    def wanted(self, obj, refs):
        if obj.get("remote_address_group_id"):
            return None       # address groups: not in fathom (docs/openstack.md)
        remote = obj.get("remote_group_id")
        return {"security_group_id": refs.id("security-groups", obj["security_group_id"]),
                "direction": obj["direction"], "ethertype": obj.get("ethertype") or "IPv4",
                "protocol": protocol_number(obj.get("protocol")),
                "port_range_min": obj.get("port_range_min"), "port_range_max": obj.get("port_range_max"),
                "remote_ip_prefix": obj.get("remote_ip_prefix") or None,
                "remote_group_id": refs.id("security-groups", remote) if remote else None,
                "description": (obj.get("description") or "")[:255], "external_id": obj["id"]}

    def current(self, fathom_obj):
        return {**fathom_obj, "protocol": protocol_number(fathom_obj.get("protocol"))}

    def update(self, api, existing, changes, project):
        raise AssertionError("rules are replaced, never updated")

    def neutron_objects(self, context):
        return directory.get_plugin().get_security_group_rules(context)
