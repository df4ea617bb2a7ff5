"""`fathom flow-records`: who talks to whom, how much, and what security groups dropped by which rule
(IPFIX samples of the nodes' OVS, added up by their agents: docs/flow-records.md).

    fathom flow-records                       the last 5 minutes' records (--top, --drops: summed)
    fathom flow-records config                the sampling rates (--ingress/--admit/--drop N: set)
    fathom flow-records export                admins: the IPFIX collector records are forwarded to
"""
from __future__ import annotations

import click

from fathom.cli.output import fail, print_json, print_table, terminal_safe
from fathom.cli.resources import DEFAULT_CONTROLLER, Api, api_command


@click.group("flow-records", invoke_without_command=True)
@click.option("--controller", envvar="FATHOM_CONTROLLER", default=DEFAULT_CONTROLLER, show_default=True,
              help="URL of the fathom controller (env FATHOM_CONTROLLER).")
@click.option("--project", envvar="FATHOM_PROJECT", default=None, help="Service tokens: the project to act for.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--of-project", default=None, help="Admins: this project's records only.")
@click.option("--port", default=None, help="Records of this port (name or id).")
@click.option("--network", type=int, default=None, help="Records of ports of this network (id).")
@click.option("--rule", default=None, help="Records naming this rule (id, or default-drop).")
@click.option("--chain", type=int, default=None, help="Records of this port chain's hops (id).")
@click.option("--kind", type=click.Choice(["admit", "drop", "admit-egress", "admit-ingress", "drop-egress",
                                           "drop-ingress", "port-ingress", "chain-hop", "tunnel-egress"]), default=None)
@click.option("--remote-node", default=None, help="Records of frames that left through the tunnel to this node.")
@click.option("--since", type=float, default=300, show_default=True, help="Seconds back from now.")
@click.option("--top", "view", flag_value="top", help="Top talkers: bytes each port sent, per destination.")
@click.option("--drops", "view", flag_value="drops", help="Drops per port and rule, most packets first.")
@click.option("--limit", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.pass_context
def flow_records(ctx, controller, project, as_json, of_project, port, network, rule, chain, kind, remote_node, since,
                 view, limit):
    """Flow records: per interval, observation point and 5-tuple (counts scaled by the sampling rate)."""
    if ctx.invoked_subcommand is not None:
        return
    api = Api(controller, project)
    params = {"since": since, "limit": limit, "view": view or "records", "project": of_project,
              "port": api.find("ports", port)["id"] if port else None, "network": network, "rule": rule,
              "chain": chain, "kind": kind, "remote_node": remote_node}
    out = api.call("GET", "/flow-records", params={k: v for k, v in params.items() if v is not None})
    if as_json:
        return print_json(out)
    for missing in out.get("partial", []):     # a replica of the cluster that did not answer: its records are not here
        click.echo(f"warning: partial answer: replica {terminal_safe(missing)}", err=True)
    rows = out["records"]
    if out["view"] == "drops":
        return print_table("drops by rule", ["project", "port", "rule", "where", "packets", "bytes"],
                           [[r["project"], r["port"], r["rule"], r["kind"], r["packets"], r["bytes"]] for r in rows])
    if out["view"] == "top":
        return print_table("top talkers", ["project", "port", "source", "destination", "proto", "dport", "packets",
                                           "bytes"],
                           [[r["project"], r["port"], r["src"], r["dst"], r["proto"], r["dport"], r["packets"],
                             r["bytes"]] for r in rows])
    print_table("flow records", ["node", "port", "kind", "rule / hop / to", "source", "destination", "proto",
                                 "packets", "bytes", "rate"],
                [[r["node"], r["port"] or "", r["kind"], _owner(r),
                  f"{r['src']}:{r['sport']}", f"{r['dst']}:{r['dport']}", r["proto"], r["packets"], r["bytes"],
                  f"1:{r['rate']}"] for r in rows])


@api_command(flow_records, "config")
@click.option("--port", default=None, help="This port's rates (name or id) instead of its project's.")
@click.option("--project-id", default=None, help="Admins: this project's rates.")
@click.option("--ingress", type=click.IntRange(0, 65535), default=None, help="Sample 1 in N packets ports send.")
@click.option("--admit", type=click.IntRange(0, 65535), default=None,
              help="Sample 1 in N connections a rule admits (per project).")
@click.option("--drop", type=click.IntRange(0, 65535), default=None, help="Sample 1 in N packets dropped (1: all).")
@click.option("--off", is_flag=True, help="Remove the rates (a port: back to its project's).")
def config(api: Api, as_json: bool, port, project_id, ingress, admit, drop, off):
    """Show the sampling rates, or set them (one in N packets; 0 = off) with --ingress/--admit/--drop."""
    port_id = api.find("ports", port)["id"] if port else None
    if port_id is not None and project_id is not None:
        fail("give --port or --project-id, not both")
    where = {"port_id": port_id} if port_id is not None else {"project_id": project_id} if project_id else {}
    if off:
        api.call("DELETE", "/flow-records/config", params=where)
    elif (ingress, admit, drop) != (None, None, None):
        api.call("PUT", "/flow-records/config",
                 json={**where, "ingress": ingress or 0, "admit": admit or 0, "drop": drop or 0})
    rows = api.call("GET", "/flow-records/config")
    if as_json:
        return print_json(rows)
    print_table("flow-records sampling (1 in N; 0 = off)", ["project", "port", "ingress", "admit", "drop"],
                [[r["project_id"], r["port_id"] or "(project)", r["ingress"], r["admit"], r["drop"]] for r in rows])


@api_command(flow_records, "export")
@click.option("--collector", default=None, metavar="IP:PORT",
              help="Forward filed records as IPFIX (UDP) to this collector ([v6]:port for IPv6).")
@click.option("--off", is_flag=True, help="Stop forwarding.")
def export(api: Api, as_json: bool, collector, off):
    """Admins: show or set the external IPFIX collector flow records are forwarded to."""
    if collector and off:
        fail("give --collector or --off, not both")
    if off:
        api.call("DELETE", "/flow-records/export")
    elif collector:
        host, sep, port = collector.rpartition(":")
        if not sep or not port.isdigit():
            fail(f"{collector!r}: give the collector as IP:PORT")
        api.call("PUT", "/flow-records/export", json={"host": host.strip("[]"), "port": int(port)})
    out = api.call("GET", "/flow-records/export")
    if as_json:
        return print_json(out)
    where = "off" if out["host"] is None else f"{out['host']}:{out['port']}"
    print_table("flow-records export (IPFIX over UDP)", ["collector", "records sent", "messages", "errors"],
                [[where, out["sent"]["records"], out["sent"]["messages"], out["sent"]["errors"]]])


def _owner(r: dict) -> str:
    """What admitted or dropped a record's frames (a rule), the chain hop it was on, or the node the
    tunnel took it to."""
    if r.get("remote_node"):
        return f"to {r['remote_node']}"
    if r.get("chain"):
        c = r["chain"]
        return f"chain {c['id']} group {c['group_index']}" + (" (replies)" if c["direction"] else "")
    return "" if r["rule"] is None else str(r["rule"])
