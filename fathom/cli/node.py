"""`fathom node ...`: the hosts whose br-int the controller programs (fathom.cli.resources: the
conventions every resource command shares)."""
from __future__ import annotations

import click

from fathom.cli.resources import _delete, _given, _list, _reason, _settle, _show, api_command, wait_options


@click.group()
def node():
    """Nodes: the hosts whose br-int the controller programs (admin only)."""


@api_command(node, "create")
@click.argument("name")
@click.option("--role", type=click.Choice(["compute", "gateway"]), default="compute", show_default=True)
@click.option("--tunnel-ip", help="VXLAN endpoint address of the node.")
@click.option("--management-ip", help="Address the controller reaches the node's OVSDB at.")
@click.option("--datapath-type", type=click.Choice(["system", "netdev", "auto"]), default="auto", show_default=True,
              help="OVS datapath of its bridges; auto: what its agent reports (system with the kernel module).")
@wait_options
def node_create(api, as_json, name, role, tunnel_ip, management_ip, datapath_type, wait, timeout):
    """Register a node."""
    body = {"name": name, "role": role, "tunnel_ip": tunnel_ip, "management_ip": management_ip,
            "datapath_type": None if datapath_type == "auto" else datapath_type}
    _show(_settle(api, "nodes", api.call("POST", "/nodes", json=body), wait, timeout), as_json, "node")


@api_command(node, "list")
def node_list(api, as_json):
    """List nodes."""
    _list(api.list("/nodes"), as_json, "nodes",
          ["id", "name", "role", "tunnel_ip", "management_ip", "datapath_type", "state", "status"],
          {"status": _reason, "datapath_type": lambda o: o.get("datapath_type") or "auto"})


@api_command(node, "show")
@click.argument("ref")
def node_show(api, as_json, ref):
    """Show a node (by id or name)."""
    _show(api.find("nodes", ref), as_json, "node")


@api_command(node, "update")
@click.argument("ref")
@click.option("--role", type=click.Choice(["compute", "gateway"]))
@click.option("--tunnel-ip", help="VXLAN endpoint address of the node.")
@click.option("--management-ip", help="Address the controller reaches the node's OVSDB at.")
@click.option("--datapath-type", type=click.Choice(["system", "netdev", "auto"]),
              help="OVS datapath of its bridges; auto: what its agent reports.")
@wait_options
def node_update(api, as_json, ref, role, tunnel_ip, management_ip, datapath_type, wait, timeout):
    """Change a node (by id or name): only the options given."""
    body = _given(role=role, tunnel_ip=tunnel_ip, management_ip=management_ip)
    if datapath_type is not None:
        body["datapath_type"] = None if datapath_type == "auto" else datapath_type
    changed = api.call("PATCH", f"/nodes/{api.find('nodes', ref)['id']}", json=body)
    _show(_settle(api, "nodes", changed, wait, timeout), as_json, "node")


@api_command(node, "delete")
@click.argument("ref")
def node_delete(api, as_json, ref):
    """Delete a node (it must have no bound ports)."""
    _delete(api, "nodes", ref)
