"""`fathom pptmon attachment ...`: PPTMon programs on a node's interfaces, loaded by its agent
(fathom.cli.resources: the conventions every resource command shares)."""
from __future__ import annotations

import click

from fathom.cli.output import console, fail, plain
from fathom.cli.resources import _list, _reason, _show, api_command


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
