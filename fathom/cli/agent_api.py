"""`fathom agent list` and `fathom agent show`: the agents as the controller sees them (through
the API; apart from fathom.cli.agent so that `fathom agent run` does not load the API client)."""
from __future__ import annotations

import click

from fathom.cli.output import print_json, print_table
from fathom.cli.resources import api_command

# the commands, for fathom.cli.agent's group to take
commands = click.Group("agent-api")


def _agents_command(name: str):
    return api_command(commands, name)


@_agents_command("list")
def agent_list(api, as_json):
    """Every node's agent as the controller sees it: up or down, revision applied, facts, objects."""
    import time as _time
    agents = api.call("GET", "/agents")
    if as_json:
        return print_json(agents)
    rows = []
    for a in agents:
        f = a.get("facts") or {}
        bad = sum(1 for o in (a.get("objects") or {}).values() if o.get("status") != "active")
        rows.append([a["node"], a["state"], f"{a.get('applied_revision')}/{a['revision']}",
                     f"{round(_time.time() - a['reported_at'], 1)} s ago" if a.get("reported_at") else "never",
                     f.get("ovs_version"), ",".join(f.get("datapath_types") or []),
                     "yes" if f.get("ovs_kernel_module") else "no", len(a.get("objects") or {}), bad])
    print_table("agents", ["node", "state", "applied/revision", "last report", "OVS", "datapath types",
                           "kernel module", "objects", "not active"], rows)


@_agents_command("show")
@click.argument("node")
def agent_show(api, as_json, node):
    """One node's agent: facts and the status of every object it holds."""
    from fathom.cli.output import print_record
    a = api.call("GET", f"/agents/{node}")
    if as_json:
        return print_json(a)
    print_record(f"agent on {node}", a)
