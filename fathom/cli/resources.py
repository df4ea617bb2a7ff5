"""What every command on the controller's REST API shares: its client (`Api`), its options
(`api_command`, `wait_options`) and how it shows, lists, deletes and waits for an object. Each
resource's commands live in their own module (fathom.cli.node, .network, .subnet, .port, .router,
.floatingip, .secgroup, .sfc, .tap, ...).

Every command takes --controller (env FATHOM_CONTROLLER) and --json; it authenticates with the
token of FATHOM_TOKEN or FATHOM_TOKEN_FILE (fathom.auth.client). A service token may act for a
project with --project (env FATHOM_PROJECT). Objects are named by id or by name; a name that
matches several objects is an error that lists their ids. Lists are read page by page.
"""
from __future__ import annotations

import functools

import click

from fathom.cli.output import console, fail, plain, print_json, print_record, print_table
from fathom.cli.renamed import renamed
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


def project_id_option(what: str):
    """--project-id: the project owning the object created (the API's `project_id`; --owner before)."""
    def decorate(fn):
        fn = click.option("--project-id", help=f"Project owning the {what} (admin only).")(fn)
        return renamed("--owner", "project_id")(fn)
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


def _given(**options) -> dict:
    """The options the user gave (not None): the body of a partial update."""
    return {k: v for k, v in options.items() if v is not None}


def _reason(obj: dict) -> str:
    return obj["status"] + (f" ({obj['status_reason']})" if obj.get("status_reason") else "")
