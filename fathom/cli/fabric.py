"""`fathom fabric …`: fabric switches, their links and their ports' VLANs.

Where a router runs is a field of the router: `fathom router update R --mode fabric`."""
from __future__ import annotations

import click

from fathom.cli.output import print_json, print_table, terminal_safe
from fathom.cli.resources import api_command


@click.group()
def fabric():
    """Fabric switches: their links to the nodes and the VLANs on each port."""


@api_command(fabric, "add")
@click.argument("name")
@click.option("--management-ip", required=True, help="where the switch serves OVSDB (port 6640)")
@click.option("--bridge", default="br-fabric", show_default=True)
@click.option("--vlans", default="100-999", show_default=True, help="VLAN range of tenant networks")
@click.option("--link", "links", multiple=True, metavar="NODE=PORT", help="declared wiring (LLDP overrides it)")
def add(api, as_json, name, management_ip, bridge, vlans, links):
    """Register a fabric switch."""
    lo, _, hi = vlans.partition("-")
    body = {"name": name, "management_ip": management_ip, "bridge": bridge, "vlan_min": int(lo),
            "vlan_max": int(hi or lo), "links": dict(x.split("=", 1) for x in links)}
    out = api.call("POST", "/fabric/switches", json=body)
    print_json(out) if as_json else click.echo(terminal_safe(f"fabric switch {out['id']} ({out['name']}) registered"))


@api_command(fabric, "list")
def list_(api, as_json):
    """Fabric switches and their links."""
    out = api.list("/fabric/switches")
    if as_json:
        return print_json(out)
    print_table(None, ["id", "name", "management ip", "VLANs", "status", "links"],
                [[s["id"], s["name"], s["management_ip"], f"{s['vlan_min']}-{s['vlan_max']}", s["status"],
                  " ".join(f"{x['port_name']}→{x['node']}({x['source']})" for x in s["links"])] for s in out])


@api_command(fabric, "status")
@click.argument("switch_id", type=int, default=1)
def status(api, as_json, switch_id):
    """Per fabric switch port: the node behind it, its VLANs (desired, and read from the switch), and the VLANs
    the node sends (read from its br-int); a VLAN sent but not allowed is dropped by the fabric switch."""
    out = api.call("GET", f"/fabric/switches/{switch_id}/status")
    if as_json:
        return print_json(out)
    click.echo(terminal_safe(f"{out['name']}: {out['status']}, connected {out['connected']}, in sync {out['in_sync']}"))
    vlans = lambda v: "-" if v is None else ",".join(map(str, v))  # noqa: E731
    print_table(None, ["port", "ofport", "node", "known by", "VLANs desired", "VLANs on the switch",
                       "VLANs the node sends", "blocked"],
                [[p["port"], p["ofport"], p["node"], "+".join(p["link"]), vlans(p["vlans_desired"]), vlans(p["vlans"]),
                  vlans(p["vlans_sent"]), vlans(p["vlans_blocked"])] for p in out["ports"]])
