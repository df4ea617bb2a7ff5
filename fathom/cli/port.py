"""`fathom port ...`: a network's ports, their addresses, binding and security groups
(fathom.cli.resources: the conventions every resource command shares)."""
from __future__ import annotations

import click

from fathom.cli.renamed import renamed
from fathom.cli.resources import (
    _delete, _given, _list, _reason, _settle, _show, api_command, project_id_option, wait_options,
)


def _ips(port: dict) -> str:
    return " ".join(f["ip_address"] for f in port.get("fixed_ips", []))


@click.group()
def port():
    """Ports: a workload's attachment to a network, bound to a node's br-int interface."""


@api_command(port, "create")
@click.argument("name")
@click.option("--network", "network_ref", required=True, help="Network id or name.")
@renamed("--mac", "mac_address")
@click.option("--mac-address", help="MAC address (default: generated).")
@renamed("--ip", "fixed_ips")
@click.option("--fixed-ip", "fixed_ips", multiple=True, metavar="IP",
              help="Fixed IP address (repeatable; default: one allocated).")
@click.option("--subnet", "subnet_ref", help="Allocate the address from this subnet.")
@renamed("--no-ip", "no_fixed_ip")
@click.option("--no-fixed-ip", is_flag=True, help="A port without any address.")
@click.option("--node", help="Node the port is bound to.")
@renamed("--interface", "interface_name")
@click.option("--interface-name", help="OVS interface name of the port on the node's br-int.")
@click.option("--no-port-security", is_flag=True,
              help="Let the port send from any MAC / IP, and no security group filter it.")
@click.option("--security-group", "group_refs", multiple=True,
              help="Security group id or name (repeatable; default: the project's default group).")
@click.option("--no-security-groups", is_flag=True, help="No security group: the port sends and receives no IP.")
@project_id_option("port")
@wait_options
def port_create(api, as_json, name, network_ref, mac_address, fixed_ips, subnet_ref, no_fixed_ip, node,
                interface_name, no_port_security, group_refs, no_security_groups, project_id, wait, timeout):
    """Create a port."""
    body = {"name": name, "network_id": api.find("networks", network_ref)["id"],
            "port_security": not no_port_security}
    if group_refs or no_security_groups or no_port_security:
        body["security_groups"] = [api.find("security-groups", g)["id"] for g in group_refs]
    subnet_id = api.find("subnets", subnet_ref)["id"] if subnet_ref else None
    if no_fixed_ip:
        body["fixed_ips"] = []
    elif fixed_ips:
        body["fixed_ips"] = [{"ip_address": ip, **({"subnet_id": subnet_id} if subnet_id else {})}
                             for ip in fixed_ips]
    elif subnet_id:
        body["fixed_ips"] = [{"subnet_id": subnet_id}]
    body.update(_given(mac_address=mac_address, node=node, interface_name=interface_name, project_id=project_id))
    _show(_settle(api, "ports", api.call("POST", "/ports", json=body), wait, timeout),
          as_json, "port")


@api_command(port, "list")
@click.option("--network", "network_ref", help="Only ports of this network.")
@click.option("--node", help="Only ports bound to this node.")
def port_list(api, as_json, network_ref, node):
    """List ports (router interfaces included: see router_id)."""
    params = {"network_id": api.find("networks", network_ref)["id"]} if network_ref else {}
    if node:
        params["node"] = node
    _list(api.list("/ports", params=params), as_json, "ports",
          ["id", "name", "network_id", "mac_address", "fixed_ips", "node", "interface_name",
           "security_groups", "router_id", "status"],
          {"fixed_ips": _ips, "status": _reason,
           "security_groups": lambda o: " ".join(str(g) for g in o.get("security_groups", []))})


@api_command(port, "show")
@click.argument("ref")
def port_show(api, as_json, ref):
    """Show a port (by id or name)."""
    _show(api.find("ports", ref), as_json, "port")


@api_command(port, "update")
@click.argument("ref")
@click.option("--name")
@click.option("--node", help="Bind the port to this node ('none' unbinds it).")
@renamed("--interface", "interface_name")
@click.option("--interface-name", help="Its OVS interface on that node ('none' for none).")
@click.option("--port-security/--no-port-security", default=None,
              help="Drop frames whose source MAC or IP is not the port's, and filter with its security "
                   "groups (--no-port-security also removes its groups).")
@click.option("--security-group", "group_refs", multiple=True,
              help="Replace the port's security groups with these (id or name, repeatable).")
@click.option("--no-security-groups", is_flag=True, help="Remove every security group of the port.")
@wait_options
def port_update(api, as_json, ref, name, node, interface_name, port_security, group_refs, no_security_groups,
                wait, timeout):
    """Change a port (by id or name): only the options given."""
    none = lambda v: None if v is not None and v.lower() == "none" else v  # noqa: E731
    body = _given(name=name, port_security=port_security)
    if group_refs or no_security_groups or port_security is False:
        body["security_groups"] = [api.find("security-groups", g)["id"] for g in group_refs]
    if node is not None:
        body["node"] = none(node)
    if interface_name is not None:
        body["interface_name"] = none(interface_name)
    changed = api.call("PATCH", f"/ports/{api.find('ports', ref)['id']}", json=body)
    _show(_settle(api, "ports", changed, wait, timeout), as_json, "port")


@api_command(port, "delete")
@click.argument("ref")
def port_delete(api, as_json, ref):
    """Delete a port."""
    _delete(api, "ports", ref)
