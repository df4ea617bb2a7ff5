"""`fathom floatingip ...`: addresses of an external network mapped 1:1 to a port (docs/external.md)."""
from __future__ import annotations

import click

from fathom.cli.output import console
from fathom.cli.renamed import renamed
from fathom.cli.resources import _given, _list, _reason, _show, api_command, project_id_option


@click.group()
def floatingip():
    """Floating IPs: an external network's address mapped 1:1 to a port's fixed IP (DNAT in, SNAT out,
    on the router's gateway node)."""


def _port_id(api, ref: str | None) -> int | None:
    return None if ref is None else api.find("ports", ref)["id"]


@api_command(floatingip, "create")
@click.argument("network_ref")
@click.option("--port", "port_ref", help="Port (id or name) to associate with.")
@renamed("--fixed-ip", "fixed_ip_address")
@click.option("--fixed-ip-address", help="Which of the port's fixed IPs (default: its first).")
@renamed("--ip", "floating_ip_address")
@click.option("--floating-ip-address", help="The floating address (admin only; default: allocated).")
@click.option("--name", default="")
@project_id_option("floating IP")
def floatingip_create(api, as_json, network_ref, port_ref, fixed_ip_address, floating_ip_address, name, project_id):
    """Allocate a floating IP on an external network (by id or name), optionally associated."""
    body = {"floating_network_id": api.find("networks", network_ref)["id"], "name": name,
            **_given(port_id=_port_id(api, port_ref), fixed_ip_address=fixed_ip_address,
                     floating_ip_address=floating_ip_address, project_id=project_id)}
    _show(api.call("POST", "/floatingips", json=body), as_json, "floating IP")


@api_command(floatingip, "list")
def floatingip_list(api, as_json):
    """List floating IPs."""
    _list(api.list("/floatingips"), as_json, "floating IPs",
          ["id", "name", "project_id", "floating_ip_address", "port_id", "fixed_ip_address", "router_id", "status"],
          {"status": _reason})


@api_command(floatingip, "show")
@click.argument("ref")
def floatingip_show(api, as_json, ref):
    """Show a floating IP (by id or name)."""
    _show(api.find("floatingips", ref), as_json, "floating IP")


@api_command(floatingip, "associate")
@click.argument("ref")
@click.argument("port_ref")
@renamed("--fixed-ip", "fixed_ip_address")
@click.option("--fixed-ip-address", help="Which of the port's fixed IPs (default: its first).")
def floatingip_associate(api, as_json, ref, port_ref, fixed_ip_address):
    """Map a floating IP to a port (moving it if it is mapped elsewhere)."""
    body = {"port_id": _port_id(api, port_ref), **_given(fixed_ip_address=fixed_ip_address)}
    _show(api.call("PATCH", f"/floatingips/{api.find('floatingips', ref)['id']}", json=body), as_json,
          "floating IP")


@api_command(floatingip, "disassociate")
@click.argument("ref")
def floatingip_disassociate(api, as_json, ref):
    """Unmap a floating IP (it stays allocated)."""
    _show(api.call("PATCH", f"/floatingips/{api.find('floatingips', ref)['id']}", json={"port_id": None}),
          as_json, "floating IP")


@api_command(floatingip, "delete")
@click.argument("ref")
def floatingip_delete(api, as_json, ref):
    """Release a floating IP."""
    obj = api.find("floatingips", ref)
    api.call("DELETE", f"/floatingips/{obj['id']}")
    console.print(f"deleted floating IP {obj['id']} ({obj['floating_ip_address']})")
