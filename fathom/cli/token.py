"""`fathom token create|list|revoke`: the controller's API tokens (admin only).

A token is shown once, when it is created; the controller keeps only its SHA-256 digest.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import click

from fathom.cli.output import console, print_json, print_record, print_table
from fathom.cli.resources import api_command
from fathom.pptmon.records import parse_duration


@click.group()
def token():
    """API tokens: who may call the controller, as which project and roles (admin only)."""


@api_command(token, "create")
@click.option("--project-id", "project_id", required=True, help="The project the token acts as.")
@click.option("--role", "roles", multiple=True, required=True,
              type=click.Choice(["admin", "member", "service", "agent"]), help="Repeatable.")
@click.option("--node", help="agent tokens: the node whose PPTMon records it delivers.")
@click.option("--expires", help="a duration from now (30d, 12h) or an ISO 8601 time; default never.")
@click.option("--name", default="", help="what the token is for.")
@click.option("--output", "output", type=click.Path(dir_okay=False),
              help="write the token to this file (mode 0600) instead of printing it.")
def token_create(api, as_json, project_id, roles, node, expires, name, output):
    """Issue a token."""
    body = {"name": name, "project_id": project_id, "roles": list(roles), "node": node}
    if expires:
        body["expires_at"] = _expiry(expires)
    created = api.call("POST", "/tokens", json=body)
    if output:
        from pathlib import Path

        from fathom.auth.tokens import write_secret
        write_secret(Path(output), created.pop("token"))
        created["token_file"] = output
    if as_json:
        return print_json(created)
    print_record("token", created)
    if not output:
        console.print("[yellow]the token is shown once: keep it now[/yellow]")


@api_command(token, "list")
def token_list(api, as_json):
    """List tokens (never their secrets)."""
    rows = api.list("/tokens")
    if as_json:
        return print_json(rows)
    print_table("tokens", ["id", "name", "project_id", "roles", "node", "expires_at", "revoked_at"],
                [[t["id"], t["name"], t["project_id"], ",".join(t["roles"]), t["node"], t["expires_at"],
                  t["revoked_at"]] for t in rows])


@api_command(token, "revoke")
@click.argument("token_id", type=int)
def token_revoke(api, as_json, token_id):
    """Revoke a token by id: it stops working at once."""
    api.call("DELETE", f"/tokens/{token_id}")
    if as_json:
        return print_json({"revoked": token_id})
    console.print(f"revoked token {token_id}")


def _expiry(text: str) -> str:
    try:
        return (datetime.now(timezone.utc) + timedelta(seconds=parse_duration(text))).isoformat()
    except (ValueError, OverflowError):
        pass
    try:
        return datetime.fromisoformat(text).isoformat()
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither a duration (30d) nor an ISO 8601 time",
                                 param_hint="--expires") from None
