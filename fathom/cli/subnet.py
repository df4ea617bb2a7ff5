"""`fathom subnet ...`: a network's address ranges, gateway and DHCP (fathom.cli.resources: the
conventions every resource command shares)."""
from __future__ import annotations

import click

from fathom.cli.renamed import renamed
from fathom.cli.resources import _delete, _list, _reason, _settle, _show, api_command, project_id_option, wait_options


@click.group()
def subnet():
    """IPv4 subnets of networks."""


def _host_route(text: str) -> dict:
    """DESTINATION,NEXTHOP (e.g. 10.9.0.0/16,198.19.1.5) -> the API's host route."""
    destination, sep, nexthop = text.partition(",")
    if not sep or not destination or not nexthop:
        raise click.BadParameter(f"{text!r}: expected DESTINATION,NEXTHOP (e.g. 10.9.0.0/16,192.0.2.5)")
    return {"destination": destination.strip(), "nexthop": nexthop.strip()}


def _dhcp_options(f):
    """The DHCP options of `subnet create` and `subnet update` (docs/dhcp.md)."""
    f = click.option("--host-route", "host_routes", multiple=True, metavar="DEST,NEXTHOP",
                     help="A route given to DHCP clients (option 121); repeat for more (20 at most).")(f)
    f = click.option("--dns-nameserver", "dns_nameservers", multiple=True, metavar="IP",
                     help="A DNS server given to DHCP clients; repeat for more (5 at most).")(f)
    f = renamed("--dns", "dns_nameservers")(f)
    return click.option("--dhcp/--no-dhcp", "enable_dhcp", default=None,
                         help="Serve the subnet's ports by DHCP (default on create: on).")(f)


def _dhcp_body(enable_dhcp, dns_nameservers, host_routes, clear_dns=False, clear_routes=False) -> dict:
    body = {}
    if enable_dhcp is not None:
        body["enable_dhcp"] = enable_dhcp
    if dns_nameservers or clear_dns:
        body["dns_nameservers"] = list(dns_nameservers)
    if host_routes or clear_routes:
        body["host_routes"] = [_host_route(r) for r in host_routes]
    return body


def _dhcp_cell(obj: dict) -> str:
    """The subnet's DHCP in one cell: off, or its servers' statuses per node."""
    if not obj.get("enable_dhcp", True):
        return "off"
    servers = obj.get("dhcp_status") or []
    return " ".join(f"{d['node']}:{d['status']}" for d in servers) or "on (no server yet)"


@api_command(subnet, "create")
@click.argument("name")
@click.option("--network", "network_ref", required=True, help="Network id or name.")
@click.option("--cidr", required=True, help="e.g. 10.0.0.0/24")
@renamed("--gateway", "gateway_ip")
@click.option("--gateway-ip", help="Gateway address (default: the first host).")
@click.option("--no-gateway", is_flag=True, help="A subnet without a gateway.")
@_dhcp_options
@project_id_option("subnet")
@wait_options
def subnet_create(api, as_json, name, network_ref, cidr, gateway_ip, no_gateway, enable_dhcp, dns_nameservers,
                  host_routes, project_id, wait, timeout):
    """Create a subnet."""
    body = {"name": name, "network_id": api.find("networks", network_ref)["id"], "cidr": cidr,
            **_dhcp_body(enable_dhcp, dns_nameservers, host_routes)}
    if no_gateway:
        body["gateway_ip"] = None
    elif gateway_ip:
        body["gateway_ip"] = gateway_ip
    if project_id:
        body["project_id"] = project_id
    _show(_settle(api, "subnets", api.call("POST", "/subnets", json=body), wait, timeout),
          as_json, "subnet")


@api_command(subnet, "list")
@click.option("--network", "network_ref", help="Only subnets of this network.")
def subnet_list(api, as_json, network_ref):
    """List subnets."""
    params = {"network_id": api.find("networks", network_ref)["id"]} if network_ref else {}
    _list(api.list("/subnets", params=params), as_json, "subnets",
          ["id", "name", "network_id", "cidr", "gateway_ip", "dhcp", "status"], {"status": _reason, "dhcp": _dhcp_cell})


@api_command(subnet, "show")
@click.argument("ref")
def subnet_show(api, as_json, ref):
    """Show a subnet (by id or name)."""
    _show(api.find("subnets", ref), as_json, "subnet")


@api_command(subnet, "update")
@click.argument("ref")
@click.option("--name", help="The new name.")
@_dhcp_options
@renamed("--no-dns", "clear_dns")
@click.option("--no-dns-nameservers", "clear_dns", is_flag=True, help="Give DHCP clients no DNS server.")
@click.option("--no-host-routes", "clear_routes", is_flag=True, help="Give DHCP clients no host route.")
@wait_options
def subnet_update(api, as_json, ref, name, enable_dhcp, dns_nameservers, host_routes, clear_dns, clear_routes,
                  wait, timeout):
    """Change a subnet (by id or name): its name, its DHCP options (a list given replaces the
    subnet's; running clients get the new options when they renew)."""
    if clear_dns and dns_nameservers:
        raise click.UsageError("--no-dns-nameservers and --dns-nameserver exclude each other")
    if clear_routes and host_routes:
        raise click.UsageError("--no-host-routes and --host-route exclude each other")
    body = _dhcp_body(enable_dhcp, dns_nameservers, host_routes, clear_dns, clear_routes)
    if name is not None:
        body["name"] = name
    if not body:
        raise click.UsageError("nothing to change: give --name or a DHCP option")
    changed = api.call("PATCH", f"/subnets/{api.find('subnets', ref)['id']}", json=body)
    _show(_settle(api, "subnets", changed, wait, timeout), as_json, "subnet")


@api_command(subnet, "delete")
@click.argument("ref")
def subnet_delete(api, as_json, ref):
    """Delete a subnet (no port or router interface may use it)."""
    _delete(api, "subnets", ref)
