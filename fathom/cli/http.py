"""Calling the controller's REST API from the CLI, with its field errors shown on one line each."""
import click
import httpx

from fathom.cli.output import fail

controller_option = click.option("--controller", "-c", default="http://127.0.0.1:8080", show_default=True,
                                  envvar="FATHOM_CONTROLLER", help="Controller URL.")


def api_call(controller: str, method: str, path: str, **kwargs):
    try:
        r = httpx.request(method, controller.rstrip("/") + path, timeout=60, **kwargs)
    except httpx.HTTPError as e:
        fail(f"cannot reach the controller at {controller}: {e} (start it with 'fathom controller')")
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        if isinstance(detail, list):
            detail = "; ".join(f"{'.'.join(str(p) for p in d.get('loc', [])[1:]) or 'request'}: {d.get('msg')}"
                               for d in detail)
        fail(f"{method} {path}: {r.status_code} {detail}")
    return r.json() if r.content else None
