"""`fathom node|network|subnet|port|router ...`: the controller's resources over its REST API.

Every command takes --controller (env FATHOM_CONTROLLER) and --json; it authenticates with the
token of FATHOM_TOKEN or FATHOM_TOKEN_FILE (fathom.auth.client). A service token may act for a
project with --project (env FATHOM_PROJECT). Objects are named by id or by name; a name that
matches several objects is an error that lists their ids. Lists are read page by page.
"""
from __future__ import annotations

import functools

import click

from fathom.cli.output import console, fail, plain, print_json, print_record, print_table
from fathom.client import DEFAULT_CONTROLLER, ApiError, Client

class Api(Client):
    """The API client of CLI commands: an error ends the command with its one-line message."""

    def __init__(self, url: str, project: str | None = None):
        super().__init__(url, project=project)

    def call(self, method: str, path: str, **kwargs):
        try:
            return self.request(method, path, **kwargs)
        except ApiError as e:
            fail(str(e))

    def find(self, collection: str, ref: str) -> dict:
        try:
            return super().find(collection, ref)
        except ApiError as e:
            fail(str(e))

    def list(self, path: str, params: dict | None = None, page: int = 1000) -> list:
        try:
            return super().list(path, params, page)
        except ApiError as e:
            fail(str(e))


def api_command(group: click.Group, name: str | None = None, **kwargs):
    """A command of `group` that receives `api: Api` and `as_json: bool` first."""
    def decorate(fn):
        @group.command(name, **kwargs)
        @click.option("--controller", envvar="FATHOM_CONTROLLER", default=DEFAULT_CONTROLLER,
                      show_default=True, help="URL of the fathom controller (env FATHOM_CONTROLLER).")
        @click.option("--project", envvar="FATHOM_PROJECT", default=None,
                      help="Service tokens: the project to act for (X-Project).")
        @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
        @functools.wraps(fn)
        def command(controller, project, as_json, **params):
            return fn(Api(controller, project), as_json, **params)
        return command
    return decorate


def wait_options(fn):
    """--wait / --timeout of a command that creates or changes an object."""
    fn = click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(0.1),
                      help="With --wait: give up after this many seconds (exit status 1).")(fn)
    return click.option("--wait", is_flag=True,
                        help="Return once the controller has realised the object (status active), or "
                             "failed (error, exit status 1).")(fn)


def _settle(api: Api, collection: str, obj: dict, wait: bool, timeout: float) -> dict:
    """The object as it is once active (or error) when `wait`: the controller's long-poll."""
    if not wait:
        return obj
    try:
        obj = api.wait_status(collection, obj["id"], "active", timeout=timeout)
    except ApiError as e:
        fail(str(e))
    if obj["status"] == "error":
        fail(f"{collection[:-1]} {obj['id']}: error: {obj.get('status_reason')}")
    return obj


def _show(obj: dict, as_json: bool, title: str) -> None:
    if as_json:
        print_json(obj)
    else:
        print_record(title, obj)


def _list(objs: list[dict], as_json: bool, title: str, columns: list[str], fmt=None) -> None:
    if as_json:
        print_json(objs)
        return
    rows = [[(fmt or {}).get(c, lambda o, c=c: o.get(c))(o) for c in columns] for o in objs]
    print_table(title, columns, rows)


def _delete(api: Api, collection: str, ref: str) -> None:
    obj = api.find(collection, ref)
    api.call("DELETE", f"/{collection}/{obj['id']}")
    console.print(plain(f"deleted {collection[:-1]} {obj['id']}" + (f" ({obj['name']})" if obj.get("name") else "")))


def _ips(port: dict) -> str:
    return " ".join(f["ip_address"] for f in port.get("fixed_ips", []))


def _given(**options) -> dict:
    """The options the user gave (not None): the body of a partial update."""
    return {k: v for k, v in options.items() if v is not None}


def _reason(obj: dict) -> str:
    return obj["status"] + (f" ({obj['status_reason']})" if obj.get("status_reason") else "")


# ---------------------------------------------------------------------------------------------- node


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


# ---------------------------------------------------------------------------------------------- network


@click.group()
def network():
    """Tenant networks: vxlan (VNI), vlan (VLAN id on the uplink) or flat."""


@api_command(network, "create")
@click.argument("name")
@click.option("--type", "type_", type=click.Choice(["vxlan", "vlan", "flat"]), default="vxlan",
              show_default=True)
@click.option("--segmentation-id", type=int, help="VNI or VLAN id (default: allocated; admin only).")
@click.option("--owner", "project_id", help="Project owning the network (admin only).")
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


# ---------------------------------------------------------------------------------------------- subnet


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
    f = click.option("--dns", "dns_nameservers", multiple=True, metavar="IP",
                     help="A DNS server given to DHCP clients; repeat for more (5 at most).")(f)
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
@click.option("--gateway", help="Gateway address (default: the first host).")
@click.option("--no-gateway", is_flag=True, help="A subnet without a gateway.")
@_dhcp_options
@click.option("--owner", "project_id", help="Project owning the subnet (admin only).")
@wait_options
def subnet_create(api, as_json, name, network_ref, cidr, gateway, no_gateway, enable_dhcp, dns_nameservers,
                  host_routes, project_id, wait, timeout):
    """Create a subnet."""
    body = {"name": name, "network_id": api.find("networks", network_ref)["id"], "cidr": cidr,
            **_dhcp_body(enable_dhcp, dns_nameservers, host_routes)}
    if no_gateway:
        body["gateway_ip"] = None
    elif gateway:
        body["gateway_ip"] = gateway
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
@click.option("--no-dns", "clear_dns", is_flag=True, help="Give DHCP clients no DNS server.")
@click.option("--no-host-routes", "clear_routes", is_flag=True, help="Give DHCP clients no host route.")
@wait_options
def subnet_update(api, as_json, ref, name, enable_dhcp, dns_nameservers, host_routes, clear_dns, clear_routes,
                  wait, timeout):
    """Change a subnet (by id or name): its name, its DHCP options (a list given replaces the
    subnet's; running clients get the new options when they renew)."""
    if clear_dns and dns_nameservers:
        raise click.UsageError("--no-dns and --dns exclude each other")
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


# ---------------------------------------------------------------------------------------------- port


@click.group()
def port():
    """Ports: a workload's attachment to a network, bound to a node's br-int interface."""


@api_command(port, "create")
@click.argument("name")
@click.option("--network", "network_ref", required=True, help="Network id or name.")
@click.option("--mac", help="MAC address (default: generated).")
@click.option("--ip", "ips", multiple=True, help="Fixed IP (repeatable; default: one allocated).")
@click.option("--subnet", "subnet_ref", help="Allocate the address from this subnet.")
@click.option("--no-ip", is_flag=True, help="A port without any address.")
@click.option("--node", help="Node the port is bound to.")
@click.option("--interface", help="OVS interface name of the port on the node's br-int.")
@click.option("--no-port-security", is_flag=True,
              help="Let the port send from any MAC / IP, and no security group filter it.")
@click.option("--security-group", "group_refs", multiple=True,
              help="Security group id or name (repeatable; default: the project's default group).")
@click.option("--no-security-groups", is_flag=True, help="No security group: the port sends and receives no IP.")
@click.option("--owner", "project_id", help="Project owning the port (admin only).")
@wait_options
def port_create(api, as_json, name, network_ref, mac, ips, subnet_ref, no_ip, node, interface,
                no_port_security, group_refs, no_security_groups, project_id, wait, timeout):
    """Create a port."""
    body = {"name": name, "network_id": api.find("networks", network_ref)["id"],
            "port_security": not no_port_security}
    if group_refs or no_security_groups or no_port_security:
        body["security_groups"] = [api.find("security-groups", g)["id"] for g in group_refs]
    subnet_id = api.find("subnets", subnet_ref)["id"] if subnet_ref else None
    if no_ip:
        body["fixed_ips"] = []
    elif ips:
        body["fixed_ips"] = [{"ip_address": ip, **({"subnet_id": subnet_id} if subnet_id else {})}
                             for ip in ips]
    elif subnet_id:
        body["fixed_ips"] = [{"subnet_id": subnet_id}]
    for key, value in (("mac_address", mac), ("node", node), ("interface_name", interface),
                       ("project_id", project_id)):
        if value:
            body[key] = value
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
@click.option("--interface", help="Its OVS interface on that node ('none' for none).")
@click.option("--port-security/--no-port-security", default=None,
              help="Drop frames whose source MAC or IP is not the port's, and filter with its security "
                   "groups (--no-port-security also removes its groups).")
@click.option("--security-group", "group_refs", multiple=True,
              help="Replace the port's security groups with these (id or name, repeatable).")
@click.option("--no-security-groups", is_flag=True, help="Remove every security group of the port.")
@wait_options
def port_update(api, as_json, ref, name, node, interface, port_security, group_refs, no_security_groups, wait,
                timeout):
    """Change a port (by id or name): only the options given."""
    none = lambda v: None if v is not None and v.lower() == "none" else v  # noqa: E731
    body = _given(name=name, port_security=port_security)
    if group_refs or no_security_groups or port_security is False:
        body["security_groups"] = [api.find("security-groups", g)["id"] for g in group_refs]
    if node is not None:
        body["node"] = none(node)
    if interface is not None:
        body["interface_name"] = none(interface)
    changed = api.call("PATCH", f"/ports/{api.find('ports', ref)['id']}", json=body)
    _show(_settle(api, "ports", changed, wait, timeout), as_json, "port")


@api_command(port, "delete")
@click.argument("ref")
def port_delete(api, as_json, ref):
    """Delete a port."""
    _delete(api, "ports", ref)


# ---------------------------------------------------------------------------------------------- router


MODES = ["distributed", "fabric", "network-node"]


@click.group()
def router():
    """Routers: distributed (in every first-hop switch), fabric (on the fabric switch) or
    network-node (a router namespace on a gateway node)."""


@api_command(router, "create")
@click.argument("name")
@click.option("--owner", "project_id", help="Project owning the router (admin only).")
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
@click.option("--ip", help="Address of the interface (default: the subnet's gateway_ip).")
def router_add_interface(api, as_json, router_ref, subnet_ref, ip):
    """Attach the router to a subnet."""
    router_id = api.find("routers", router_ref)["id"]
    body = {"subnet_id": api.find("subnets", subnet_ref)["id"], **({"ip_address": ip} if ip else {})}
    _show(api.call("POST", f"/routers/{router_id}/interfaces", json=body), as_json, "interface")


@api_command(router, "remove-interface")
@click.argument("router_ref")
@click.argument("subnet_ref")
def router_remove_interface(api, as_json, router_ref, subnet_ref):
    """Detach the router from a subnet."""
    router_id = api.find("routers", router_ref)["id"]
    subnet_id = api.find("subnets", subnet_ref)["id"]
    api.call("DELETE", f"/routers/{router_id}/interfaces/{subnet_id}")


# ---------------------------------------------------------------------------------------------- pptmon attachments


@click.group("attachment")
def pptmon_attachment():
    """PPTMon programs on a node's named interfaces, loaded by the node's agent (admin only)."""


ATTACHMENT_COLUMNS = ["id", "name", "node", "chain", "mode", "in", "out", "period_ns", "status"]
ATTACHMENT_FMT = {"in": lambda o: f"{o['in_interface']}:{o['in_direction']}",
                  "out": lambda o: f"{o['out_interface']}:{o['out_direction']}", "status": _reason}


def _point(text: str, option: str) -> tuple[str, str]:
    dev, _, direction = text.partition(":")
    if direction not in ("ingress", "egress") or not dev:
        fail(f"{option}: give INTERFACE:ingress or INTERFACE:egress, not {text!r}")
    return dev, direction


@api_command(pptmon_attachment, "create")
@click.argument("name")
@click.option("--node", required=True, help="the node whose agent attaches the programs")
@click.option("--chain", required=True, help="the chain its records are filed under")
@click.option("--in", "in_point", required=True, help="where ppt_in runs: INTERFACE:ingress|egress")
@click.option("--out", "out_point", required=True, help="where ppt_out runs: INTERFACE:ingress|egress")
@click.option("--mode", type=click.Choice(["source", "transit", "sink", "source-sink"]), default="source-sink",
              show_default=True)
@click.option("--vnf-id", default=1, show_default=True, type=click.IntRange(1, 255))
@click.option("--period", default="1s", show_default=True, help="sampling period: 1s, 100ms, 0 (every packet), 20/s")
def attachment_create(api, as_json, name, node, chain, in_point, out_point, mode, vnf_id, period):
    """Attach PPTMon on a node's interfaces (its agent loads the programs)."""
    from fathom.pptmon.control import parse_period
    try:
        period_ns = parse_period(period)
    except ValueError as e:
        fail(str(e))
    (i_dev, i_dir), (o_dev, o_dir) = _point(in_point, "--in"), _point(out_point, "--out")
    body = {"name": name, "node": node, "chain": chain, "mode": mode, "vnf_id": vnf_id, "period_ns": period_ns,
            "in_interface": i_dev, "in_direction": i_dir, "out_interface": o_dev, "out_direction": o_dir}
    _show(api.call("POST", "/pptmon/attachments", json=body), as_json, "PPTMon attachment")


@api_command(pptmon_attachment, "list")
def attachment_list(api, as_json):
    """List PPTMon attachments and their status (the agents' word)."""
    _list(api.list("/pptmon/attachments"), as_json, "PPTMon attachments", ATTACHMENT_COLUMNS, ATTACHMENT_FMT)


@api_command(pptmon_attachment, "show")
@click.argument("ref")
def attachment_show(api, as_json, ref):
    """Show a PPTMon attachment (by id or name)."""
    _show(api.find("pptmon/attachments", ref), as_json, "PPTMon attachment")


@api_command(pptmon_attachment, "update")
@click.argument("ref")
@click.option("--period", required=True, help="new sampling period (changed in place, programs stay attached)")
def attachment_update(api, as_json, ref, period):
    """Change an attachment's sampling period."""
    from fathom.pptmon.control import parse_period
    try:
        period_ns = parse_period(period)
    except ValueError as e:
        fail(str(e))
    obj = api.find("pptmon/attachments", ref)
    _show(api.call("PATCH", f"/pptmon/attachments/{obj['id']}", json={"period_ns": period_ns}), as_json,
          "PPTMon attachment")


@api_command(pptmon_attachment, "delete")
@click.argument("ref")
def attachment_delete(api, as_json, ref):
    """Detach and forget a PPTMon attachment."""
    obj = api.find("pptmon/attachments", ref)
    api.call("DELETE", f"/pptmon/attachments/{obj['id']}")
    console.print(plain(f"deleted PPTMon attachment {obj['id']} ({obj['name']})"))
