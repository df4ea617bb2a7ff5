"""`fathom router ...`: routers, their interfaces and external gateway (fathom.cli.resources: the
conventions every resource command shares)."""
from __future__ import annotations

import click

from fathom.cli.output import print_json, print_record
from fathom.cli.renamed import renamed
from fathom.cli.resources import (
    _delete, _given, _list, _reason, _settle, _show, api_command, project_id_option, wait_options,
)


MODES = ["distributed", "fabric", "network-node"]


@click.group()
def router():
    """Routers: distributed (in every first-hop switch), fabric (on the fabric switch) or
    network-node (a router namespace on a gateway node)."""


@api_command(router, "create")
@click.argument("name")
@project_id_option("router")
@click.option("--mode", type=click.Choice(MODES), default="distributed", show_default=True,
              help="Where the router runs (docs/fabric.md).")
@click.option("--gateway-node", help="network-node mode: the gateway node (default: the first of role gateway).")
@click.option("--external-network", help="External network (id or name) of the router's gateway (SNAT, "
                                          "floating IPs; docs/external.md).")
@click.option("--no-snat", is_flag=True, help="With --external-network: no SNAT for ports without a floating IP.")
@wait_options
def router_create(api, as_json, name, project_id, mode, gateway_node, external_network, no_snat, wait, timeout):
    """Create a router."""
    body = {"name": name, "mode": mode, **_given(project_id=project_id, gateway_node=gateway_node)}
    if external_network:
        body["external_gateway"] = {"network_id": api.find("networks", external_network)["id"],
                                    "enable_snat": not no_snat}
    _show(_settle(api, "routers", api.call("POST", "/routers", json=body), wait, timeout),
          as_json, "router")


@api_command(router, "list")
def router_list(api, as_json):
    """List routers."""
    _list(api.list("/routers"), as_json, "routers",
          ["id", "name", "project_id", "mode", "interfaces", "external_gateway", "status"],
          {"status": _reason,
           "external_gateway": lambda o: (f"{o['external_gateway']['ip_address']} on {o['external_gateway']['node']}"
                                          if o.get("external_gateway") else ""),
           "interfaces": lambda o: " ".join(f"{i['ip_address']}(subnet {i['subnet_id']})"
                                            for i in o["interfaces"])})


@api_command(router, "show")
@click.argument("ref")
def router_show(api, as_json, ref):
    """Show a router and its interfaces (by id or name)."""
    obj = api.find("routers", ref)
    if as_json:
        print_json(obj)
        return
    gw = obj.get("external_gateway")
    print_record("router", {**{k: v for k, v in obj.items() if k not in ("interfaces", "external_gateway")},
                            "external_gateway": (f"{gw['ip_address']} ({gw['mac_address']}) on network "
                                                 f"{gw['network_id']}, node {gw['node']}, snat "
                                                 f"{'on' if gw['enable_snat'] else 'off'}") if gw else None})
    _list(obj["interfaces"], False, "interfaces",
          ["id", "subnet_id", "network_id", "ip_address", "mac_address", "status"], {"status": _reason})


@api_command(router, "update")
@click.argument("ref")
@click.option("--name")
@click.option("--mode", type=click.Choice(MODES), help="Where the router runs (docs/fabric.md).")
@click.option("--gateway-node", help="network-node mode: the gateway node (default: the first of role gateway).")
@click.option("--external-network", help="Set the router's external gateway on this network (id or name).")
@click.option("--no-snat", is_flag=True, help="With --external-network: no SNAT for ports without a floating IP.")
@click.option("--clear-gateway", is_flag=True, help="Remove the router's external gateway.")
@wait_options
def router_update(api, as_json, ref, name, mode, gateway_node, external_network, no_snat, clear_gateway, wait,
                  timeout):
    """Change a router (by id or name): rename it, move it (--mode; traffic follows), set or clear its
    external gateway."""
    body = _given(name=name, mode=mode, gateway_node=gateway_node)
    if external_network and clear_gateway:
        raise click.UsageError("--external-network and --clear-gateway exclude each other")
    if clear_gateway:
        body["external_gateway"] = None
    elif external_network:
        body["external_gateway"] = {"network_id": api.find("networks", external_network)["id"],
                                    "enable_snat": not no_snat}
    changed = api.call("PATCH", f"/routers/{api.find('routers', ref)['id']}", json=body)
    _show(_settle(api, "routers", changed, wait, timeout), as_json, "router")


@api_command(router, "delete")
@click.argument("ref")
def router_delete(api, as_json, ref):
    """Delete a router (remove its interfaces first)."""
    _delete(api, "routers", ref)


@api_command(router, "add-interface")
@click.argument("router_ref")
@click.argument("subnet_ref")
@renamed("--ip", "ip_address")
@click.option("--ip-address", help="Address of the interface (default: the subnet's gateway_ip).")
def router_add_interface(api, as_json, router_ref, subnet_ref, ip_address):
    """Attach the router to a subnet."""
    router_id = api.find("routers", router_ref)["id"]
    body = {"subnet_id": api.find("subnets", subnet_ref)["id"], **_given(ip_address=ip_address)}
    _show(api.call("POST", f"/routers/{router_id}/interfaces", json=body), as_json, "interface")


@api_command(router, "remove-interface")
@click.argument("router_ref")
@click.argument("subnet_ref")
def router_remove_interface(api, as_json, router_ref, subnet_ref):
    """Detach the router from a subnet (remove its interface there)."""
    router_id = api.find("routers", router_ref)["id"]
    api.call("DELETE", f"/routers/{router_id}/interfaces", params={"subnet_id": api.find("subnets", subnet_ref)["id"]})
