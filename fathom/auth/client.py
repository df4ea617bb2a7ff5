"""Where a client of the API (the CLI, the lab, the demo, the benchmarks, the agent) finds its token.

In order: the environment variable FATHOM_TOKEN; the file named by FATHOM_TOKEN_FILE; the
controller's admin credential in its default state directory (/var/lib/fathom/admin-token),
when readable. A lab that runs its own controller keeps the admin token in its run directory
(`fathom lab up` prints the export line); `lab_headers(state)` reads it from the lab's state.
"""
from __future__ import annotations

import os
from pathlib import Path

DEFAULT_TOKEN_FILE = Path("/var/lib/fathom/admin-token")


class NoToken(Exception):
    pass


def read_token_file(path: str | Path) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise NoToken(f"cannot read the token file {path}: {e.strerror}") from None
    if not token:
        raise NoToken(f"the token file {path} is empty")
    return token


def resolve_token(env=os.environ) -> str:
    if env.get("FATHOM_TOKEN"):
        return env["FATHOM_TOKEN"].strip()
    if env.get("FATHOM_TOKEN_FILE"):
        return read_token_file(env["FATHOM_TOKEN_FILE"])
    if os.access(DEFAULT_TOKEN_FILE, os.R_OK):
        return read_token_file(DEFAULT_TOKEN_FILE)
    raise NoToken("no API token: set FATHOM_TOKEN or FATHOM_TOKEN_FILE (`fathom lab up` prints the line; "
                  "a controller writes its admin token to <state dir>/admin-token)")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def lab_token(state: dict) -> str:
    """The token for the controller of a lab, given the lab's state (Lab.state()): the admin token
    of the controller the lab started, else the caller's own (FATHOM_TOKEN...)."""
    ctl = state.get("controller") or {}
    if ctl.get("token_file"):
        return read_token_file(ctl["token_file"])
    return resolve_token()


def lab_headers(state: dict) -> dict[str, str]:
    return bearer(lab_token(state))
