"""`fathom sfc port-pair|port-pair-group|flow-classifier|port-chain create|list|show|update|delete`:
service function chains over the REST API, named as networking-sfc (and `openstack sfc ...`) names
them. Members are given by id or name; repeat --port-pair, --port-pair-group, --flow-classifier.
`--pptmon PERIOD` measures a chain with PPTMon (`fathom sfc port-chain pptmon CHAIN` shows the times).
"""
from __future__ import annotations

import click

from fathom.cli.output import print_json, print_record, print_table
from fathom.cli.resources import Api, _delete, _reason, _settle, api_command, project_id_option, wait_options


@click.group()
def sfc():
    """Service function chains: VNF port pairs, groups of instances, flow classifiers, port chains."""


def _ref(value: str):
    return int(value) if value.isascii() and value.isdigit() else value


def _show(obj: dict, as_json: bool, title: str) -> None:
    if as_json:
        print_json(obj)
    else:
        print_record(title, obj)


def _list(api: Api, as_json: bool, collection: str, title: str, columns: list[str], fmt: dict) -> None:
    objs = api.list(f"/sfc/{collection}")
    if as_json:
        return print_json(objs)
    print_table(title, columns, [[fmt.get(c, lambda o, c=c: o.get(c))(o) for c in columns] for o in objs])


def _ids(values) -> str:
    return " ".join(str(v) for v in values)


OWNER = project_id_option("object")


def _crud(name: str, collection: str, title: str, columns: list[str], fmt: dict):
    """The list, show and delete commands of one collection (create and update differ per kind)."""
    group = click.Group(name, help=f"{title[0].upper()}{title[1:]}s (networking-sfc's {collection}).")
    sfc.add_command(group)

    @api_command(group, "list")
    def list_(api, as_json):
        """List them."""
        _list(api, as_json, collection, f"{title}s", columns, fmt)

    @api_command(group, "show")
    @click.argument("ref")
    def show_(api, as_json, ref):
        """Show one (by id or name)."""
        _show(api.find(f"sfc/{collection}", ref), as_json, title)

    @api_command(group, "delete")
    @click.argument("ref")
    def delete_(api, as_json, ref):
        """Delete one (by id or name); it must not be in use."""
        _delete(api, f"sfc/{collection}", ref)
    return group


port_pair = _crud("port-pair", "port_pairs", "port pair", ["id", "name", "project_id", "ingress", "egress",
                                                           "port_pair_group", "status"], {"status": _reason})
port_pair_group = _crud("port-pair-group", "port_pair_groups", "port pair group",
                        ["id", "name", "project_id", "port_pairs", "port_chain", "status"],
                        {"port_pairs": lambda o: _ids(o["port_pairs"]), "status": _reason})
flow_classifier = _crud("flow-classifier", "flow_classifiers", "flow classifier",
                        ["id", "name", "project_id", "logical_source_port", "logical_destination_port", "protocol",
                         "source_ip_prefix", "destination_ip_prefix", "ports", "port_chain", "status"],
                        {"ports": lambda o: _ports(o), "status": _reason})
port_chain = _crud("port-chain", "port_chains", "port chain",
                   ["id", "name", "project_id", "port_pair_groups", "flow_classifiers", "symmetric", "pptmon",
                    "status"],
                   {"port_pair_groups": lambda o: " → ".join(map(str, o["port_pair_groups"])),
                    "flow_classifiers": lambda o: _ids(o["flow_classifiers"]),
                    "symmetric": lambda o: o["chain_parameters"]["symmetric"],
                    "pptmon": lambda o: _period(o.get("pptmon")), "status": _reason})


def _period(pptmon: dict | None) -> str:
    if pptmon is None:
        return "off"
    ns = pptmon["period_ns"]
    return "every packet" if ns == 0 else f"1 per {ns / 1e9:g} s"


def _pptmon(value: str) -> dict:
    """--pptmon PERIOD: one sampled packet every PERIOD (1s, 10ms; 0 = every packet)."""
    from fathom.pptmon.records import parse_duration
    try:
        return {"period_ns": round(parse_duration(value) * 1e9)}
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--pptmon") from None


PPTMON_HELP = "Measure every VNF of the chain with PPTMon, one sampled packet every PERIOD (1s, 10ms; 0 = all)."


def _ports(fc: dict) -> str:
    def rng(side):
        lo, hi = fc[f"{side}_port_range_min"], fc[f"{side}_port_range_max"]
        return "*" if lo is None else str(lo) if lo == hi else f"{lo}-{hi}"
    return f"{rng('source')} → {rng('destination')}"


def _range(value: str | None, option: str) -> tuple[int | None, int | None]:
    if value is None:
        return None, None
    low, _, high = value.partition("-")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise click.BadParameter(f"{value!r}: a port or a range such as 1000-2000", param_hint=option) from None


@api_command(port_pair, "create")
@click.argument("name", required=False, default="")
@click.option("--ingress", required=True, help="Port (id or name) traffic enters the VNF on.")
@click.option("--egress", required=True, help="Port (id or name) traffic leaves the VNF on.")
@OWNER
def port_pair_create(api, as_json, name, ingress, egress, project_id):
    """Create a port pair: one VNF instance's ingress and egress ports (port security off on both)."""
    body = {"name": name, "ingress": _ref(ingress), "egress": _ref(egress), "project_id": project_id}
    _show(api.call("POST", "/sfc/port_pairs", json=body), as_json, "port pair")


@api_command(port_pair, "update")
@click.argument("ref")
@click.option("--name", required=True)
def port_pair_update(api, as_json, ref, name):
    """Rename a port pair."""
    pair = api.find("sfc/port_pairs", ref)
    _show(api.call("PATCH", f"/sfc/port_pairs/{pair['id']}", json={"name": name}), as_json, "port pair")


@api_command(port_pair_group, "create")
@click.argument("name", required=False, default="")
@click.option("--port-pair", "port_pairs", multiple=True, required=True, help="A port pair (repeat for more instances).")
@OWNER
def port_pair_group_create(api, as_json, name, port_pairs, project_id):
    """Create a port pair group: instances of one VNF that flows are spread over."""
    body = {"name": name, "port_pairs": [_ref(p) for p in port_pairs], "project_id": project_id}
    _show(api.call("POST", "/sfc/port_pair_groups", json=body), as_json, "port pair group")


@api_command(port_pair_group, "update")
@click.argument("ref")
@click.option("--name")
@click.option("--port-pair", "port_pairs", multiple=True, help="The group's port pairs from now on (repeat).")
def port_pair_group_update(api, as_json, ref, name, port_pairs):
    """Rename a group or change its instances (in place: chains through it follow)."""
    group = api.find("sfc/port_pair_groups", ref)
    body = {**({"name": name} if name is not None else {}),
            **({"port_pairs": [_ref(p) for p in port_pairs]} if port_pairs else {})}
    _show(api.call("PATCH", f"/sfc/port_pair_groups/{group['id']}", json=body), as_json, "port pair group")


@api_command(flow_classifier, "create")
@click.argument("name", required=False, default="")
@click.option("--logical-source-port", required=True, help="Port whose traffic is classified (id or name).")
@click.option("--logical-destination-port", help="Port the traffic is sent to (needed by symmetric chains).")
@click.option("--protocol", help="tcp, udp, icmp or a number.")
@click.option("--source-ip-prefix")
@click.option("--destination-ip-prefix")
@click.option("--source-port", help="Port or range (1000-2000); needs --protocol tcp or udp.")
@click.option("--destination-port", help="Port or range; needs --protocol tcp or udp.")
@OWNER
def flow_classifier_create(api, as_json, name, logical_source_port, logical_destination_port, protocol,
                           source_ip_prefix, destination_ip_prefix, source_port, destination_port, project_id):
    """Create a flow classifier: which IPv4 traffic of a port enters a chain."""
    sp, dp = _range(source_port, "--source-port"), _range(destination_port, "--destination-port")
    body = {"name": name, "logical_source_port": _ref(logical_source_port), "project_id": project_id,
            "logical_destination_port": _ref(logical_destination_port) if logical_destination_port else None,
            "protocol": _ref(protocol) if protocol else None, "source_ip_prefix": source_ip_prefix,
            "destination_ip_prefix": destination_ip_prefix, "source_port_range_min": sp[0],
            "source_port_range_max": sp[1], "destination_port_range_min": dp[0], "destination_port_range_max": dp[1]}
    _show(api.call("POST", "/sfc/flow_classifiers", json=body), as_json, "flow classifier")


@api_command(flow_classifier, "update")
@click.argument("ref")
@click.option("--name", required=True)
def flow_classifier_update(api, as_json, ref, name):
    """Rename a flow classifier (its fields are fixed: make a new one and update the chain)."""
    fc = api.find("sfc/flow_classifiers", ref)
    _show(api.call("PATCH", f"/sfc/flow_classifiers/{fc['id']}", json={"name": name}), as_json, "flow classifier")


@api_command(port_chain, "create")
@click.argument("name", required=False, default="")
@click.option("--port-pair-group", "group_refs", multiple=True, required=True, help="A group, in path order (repeat).")
@click.option("--flow-classifier", "classifiers", multiple=True, help="A flow classifier (repeat).")
@click.option("--symmetric", is_flag=True, help="Replies go back through the same instances.")
@click.option("--pptmon", "pptmon", metavar="PERIOD", help=PPTMON_HELP)
@OWNER
@wait_options
def port_chain_create(api, as_json, name, group_refs, classifiers, symmetric, pptmon, project_id, wait, timeout):
    """Create a port chain: classified traffic crosses each group in order, then reaches its destination."""
    body = {"name": name, "port_pair_groups": [_ref(g) for g in group_refs],
            "flow_classifiers": [_ref(c) for c in classifiers], "project_id": project_id,
            "chain_parameters": {"symmetric": symmetric}, "pptmon": _pptmon(pptmon) if pptmon is not None else None}
    chain = api.call("POST", "/sfc/port_chains", json=body)
    _show(_settle(api, "sfc/port_chains", chain, wait, timeout), as_json, "port chain")


@api_command(port_chain, "update")
@click.argument("ref")
@click.option("--name")
@click.option("--port-pair-group", "group_refs", multiple=True, help="The groups from now on, in order (repeat).")
@click.option("--flow-classifier", "classifiers", multiple=True, help="The classifiers from now on (repeat).")
@click.option("--no-flow-classifiers", is_flag=True, help="Remove every classifier (the chain steers nothing).")
@click.option("--pptmon", "pptmon", metavar="PERIOD", help=PPTMON_HELP)
@click.option("--no-pptmon", is_flag=True, help="Stop measuring the chain (the agents detach the programs).")
@wait_options
def port_chain_update(api, as_json, ref, name, group_refs, classifiers, no_flow_classifiers, pptmon, no_pptmon,
                      wait, timeout):
    """Change a chain in place (its groups, its classifiers, PPTMon); unrelated traffic is not disturbed."""
    if pptmon is not None and no_pptmon:
        raise click.UsageError("give --pptmon or --no-pptmon, not both")
    chain = api.find("sfc/port_chains", ref)
    body = {}
    if pptmon is not None or no_pptmon:
        body["pptmon"] = _pptmon(pptmon) if pptmon is not None else None
    if name is not None:
        body["name"] = name
    if group_refs:
        body["port_pair_groups"] = [_ref(g) for g in group_refs]
    if classifiers or no_flow_classifiers:
        body["flow_classifiers"] = [_ref(c) for c in classifiers]
    chain = api.call("PATCH", f"/sfc/port_chains/{chain['id']}", json=body)
    _show(_settle(api, "sfc/port_chains", chain, wait, timeout), as_json, "port chain")


def _us(summary: dict, key: str) -> str:
    return f"{summary[key]:.0f}" if summary.get("count") else "-"


@api_command(port_chain, "pptmon")
@click.argument("ref")
@click.option("--window", default="5m", show_default=True, help="How far back (30s, 5m, 2h).")
def port_chain_pptmon(api, as_json, ref, window):
    """PPTMon on a chain: processing times (µs) per VNF instance, per group and end to end."""
    chain = api.find("sfc/port_chains", ref)
    st = api.call("GET", f"/sfc/port_chains/{chain['id']}/pptmon", params={"window": window})
    if as_json:
        return print_json(st)
    cols = ["what", "node", "count", "p50_us", "p90_us", "p99_us", "max_us"]
    rows = []
    for g in st["groups"]:
        p = g["processing"]
        rows.append([f"group {g['name'] or g['id']} ({g['role']})", "", p["count"],
                     _us(p, "p50_us"), _us(p, "p90_us"), _us(p, "p99_us"), _us(p, "max_us")])
        for pair in g["port_pairs"]:
            p = pair["processing"]
            rows.append([f"  port pair {pair['name'] or pair['id']} (vnf {pair['vnf_id']})", pair["node"] or "-",
                         p["count"], _us(p, "p50_us"), _us(p, "p90_us"), _us(p, "p99_us"), _us(p, "max_us")])
    e = st["e2e"]
    rows.append(["end-to-end", "", e["count"], _us(e, "p50_us"), _us(e, "p90_us"), _us(e, "p99_us"), _us(e, "max_us")])
    print_table(f"PPTMon on port chain {st['name'] or st['port_chain']} ({_period(st['pptmon'])}, last {window}): "
                f"{st['records']} records, {st['incomplete']} incomplete, {st['lost_across']} lost across", cols, rows)
    for w in st["warnings"]:
        click.echo(f"warning: {w}")
