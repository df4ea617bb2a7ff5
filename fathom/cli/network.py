"""`fathom network ...`: tenant, provider and external networks (fathom.cli.resources: the
conventions every resource command shares)."""
from __future__ import annotations

import click

from fathom.cli.resources import (
    _delete, _given, _list, _reason, _settle, _show, api_command, project_id_option, wait_options,
)


@click.group()
def network():
    """Tenant networks: vxlan (VNI), vlan (VLAN id on the uplink) or flat."""


@api_command(network, "create")
@click.argument("name")
@click.option("--type", "type_", type=click.Choice(["vxlan", "vlan", "flat"]), default="vxlan",
              show_default=True)
@click.option("--segmentation-id", type=int, help="VNI or VLAN id (default: allocated; admin only).")
@project_id_option("network")
@click.option("--external", is_flag=True, help="A provider network reaching the gateway nodes' ext0 "
                                                "(admin; flat or vlan; docs/external.md).")
@click.option("--upstream-mac", help="External networks: MAC of the upstream router at the subnet's gateway_ip.")
@wait_options
def network_create(api, as_json, name, type_, segmentation_id, project_id, external, upstream_mac, wait, timeout):
    """Create a network."""
    body = {"name": name, "type": type_, **({"external": True} if external else {}),
            **_given(upstream_mac=upstream_mac)}
    if segmentation_id is not None:
        body["segmentation_id"] = segmentation_id
    if project_id:
        body["project_id"] = project_id
    _show(_settle(api, "networks", api.call("POST", "/networks", json=body), wait, timeout),
          as_json, "network")


@api_command(network, "list")
def network_list(api, as_json):
    """List networks."""
    _list(api.list("/networks"), as_json, "networks",
          ["id", "name", "project_id", "type", "segmentation_id", "external", "subnets", "status"],
          {"status": _reason, "subnets": lambda o: " ".join(map(str, o["subnets"]))})


@api_command(network, "show")
@click.argument("ref")
def network_show(api, as_json, ref):
    """Show a network (by id or name)."""
    _show(api.find("networks", ref), as_json, "network")


@api_command(network, "update")
@click.argument("ref")
@click.option("--name", required=True, help="The new name.")
@wait_options
def network_update(api, as_json, ref, name, wait, timeout):
    """Rename a network (by id or name)."""
    changed = api.call("PATCH", f"/networks/{api.find('networks', ref)['id']}", json={"name": name})
    _show(_settle(api, "networks", changed, wait, timeout), as_json, "network")


@api_command(network, "delete")
@click.argument("ref")
def network_delete(api, as_json, ref):
    """Delete a network (it must have no ports; its subnets go with it)."""
    _delete(api, "networks", ref)
