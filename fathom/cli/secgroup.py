"""`fathom security-group ...`: security groups and their rules over the REST API
(docs/security-groups.md). Groups are named by id or name; rules by id."""
from __future__ import annotations

import click

from fathom.cli.output import console, fail, print_json, print_record, print_table
from fathom.cli.resources import _delete, _given, _list, _reason, api_command, project_id_option

RULE_COLUMNS = ["id", "security_group_id", "direction", "ethertype", "protocol", "ports", "remote"]


def _ports(rule: dict) -> str:
    low, high = rule.get("port_range_min"), rule.get("port_range_max")
    if rule.get("protocol") in ("icmp", "ipv6-icmp"):
        return "" if low is None else f"type {low}" + ("" if high is None else f" code {high}")
    if low is None:
        return ""
    return str(low) if low == high else f"{low}-{high}"


def _remote(rule: dict) -> str:
    if rule.get("remote_group_id") is not None:
        return f"group {rule['remote_group_id']}"
    return rule.get("remote_ip_prefix") or "any"


RULE_FORMAT = {"protocol": lambda r: r.get("protocol") or "any", "ports": _ports, "remote": _remote}


@click.group("security-group")
def security_group():
    """Security groups: stateful rules on what ports send and receive (Neutron semantics)."""


@api_command(security_group, "create")
@click.argument("name")
@click.option("--description", default="")
@project_id_option("group")
def group_create(api, as_json, name, description, project_id):
    """Create a security group (with no rules: its ports send and receive nothing until rules are added)."""
    body = {"name": name, "description": description, **_given(project_id=project_id)}
    _show_group(api.call("POST", "/security-groups", json=body), as_json)


@api_command(security_group, "list")
def group_list(api, as_json):
    """List security groups (a project's default group is made on its first list)."""
    _list(api.list("/security-groups"), as_json, "security groups",
          ["id", "name", "project_id", "rules", "description", "status"],
          {"rules": lambda g: len(g["rules"]), "status": _reason})


@api_command(security_group, "show")
@click.argument("ref")
def group_show(api, as_json, ref):
    """Show a security group and its rules (by id or name)."""
    _show_group(api.find("security-groups", ref), as_json)


@api_command(security_group, "update")
@click.argument("ref")
@click.option("--name")
@click.option("--description")
def group_update(api, as_json, ref, name, description):
    """Rename or describe a security group (the default group keeps its name)."""
    group = api.find("security-groups", ref)
    body = _given(name=name, description=description)
    _show_group(api.call("PATCH", f"/security-groups/{group['id']}", json=body), as_json)


@api_command(security_group, "delete")
@click.argument("ref")
def group_delete(api, as_json, ref):
    """Delete a security group no port uses (rules of other groups naming it go with it)."""
    _delete(api, "security-groups", ref)


def _show_group(group: dict, as_json: bool) -> None:
    if as_json:
        print_json(group)
        return
    print_record("security group", {k: v for k, v in group.items() if k != "rules"})
    print_table("rules", RULE_COLUMNS, [[RULE_FORMAT.get(c, lambda r, c=c: r.get(c))(r) for c in RULE_COLUMNS]
                                        for r in group["rules"]])


def _port_range(value: str | None) -> tuple[int | None, int | None]:
    if value is None:
        return None, None
    low, _, high = value.partition("-")
    try:
        return int(low), int(high or low)
    except ValueError:
        fail(f"--port {value!r}: give a port (80) or a range (1000-2000)")


@api_command(security_group, "rule-create")
@click.argument("group_ref")
@click.option("--direction", type=click.Choice(["ingress", "egress"]), required=True)
@click.option("--ethertype", type=click.Choice(["IPv4", "IPv6"]), default="IPv4", show_default=True)
@click.option("--protocol", help="tcp, udp, icmp, icmpv6, sctp, ... or a number (default: any).")
@click.option("--port", "ports", help="TCP/UDP/SCTP destination port or range (80, 1000-2000).")
@click.option("--icmp-type", type=int, help="ICMP type (with --protocol icmp).")
@click.option("--icmp-code", type=int, help="ICMP code (needs --icmp-type).")
@click.option("--remote-ip-prefix", help="Only this remote prefix (CIDR).")
@click.option("--remote-group", "remote_group_ref", help="Only members of this group (id or name).")
@click.option("--description", default="")
def rule_create(api, as_json, group_ref, direction, ethertype, protocol, ports, icmp_type, icmp_code,
                remote_ip_prefix, remote_group_ref, description):
    """Add a rule to a security group."""
    low, high = _port_range(ports)
    if icmp_type is not None or icmp_code is not None:
        if ports:
            fail("give --port or --icmp-type/--icmp-code, not both")
        low, high = icmp_type, icmp_code
    body = {"security_group_id": api.find("security-groups", group_ref)["id"], "direction": direction,
            "ethertype": ethertype, "description": description,
            **_given(protocol=protocol, port_range_min=low, port_range_max=high,
                     remote_ip_prefix=remote_ip_prefix)}
    if remote_group_ref:
        body["remote_group_id"] = api.find("security-groups", remote_group_ref)["id"]
    rule = api.call("POST", "/security-group-rules", json=body)
    if as_json:
        print_json(rule)
    else:
        print_record("security group rule", rule)


@api_command(security_group, "rule-list")
@click.argument("group_ref", required=False)
def rule_list(api, as_json, group_ref):
    """List rules (of one group when given)."""
    params = {"security_group_id": api.find("security-groups", group_ref)["id"]} if group_ref else {}
    _list(api.list("/security-group-rules", params=params), as_json, "security group rules", RULE_COLUMNS,
          RULE_FORMAT)


@api_command(security_group, "rule-delete")
@click.argument("rule_id", type=int)
def rule_delete(api, as_json, rule_id):
    """Delete a rule: connections it admitted are cut unless another rule allows them."""
    api.call("DELETE", f"/security-group-rules/{rule_id}")
    console.print(f"deleted security group rule {rule_id}")
