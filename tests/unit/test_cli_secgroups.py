"""`fathom security-group ...` and ports' groups against the API app in-process: tables, --json, errors."""
from __future__ import annotations

import json

from .test_cli_resources import run  # noqa: F401 - the in-process CLI fixture


def test_groups_rules_and_ports_from_the_cli(run):  # noqa: F811
    run("network", "create", "blue")
    run("subnet", "create", "blue4", "--network", "blue", "--cidr", "10.0.0.0/24")
    web = json.loads(run("security-group", "create", "web", "--description", "front", "--json").output)
    assert (web["name"], web["rules"]) == ("web", [])
    rule = json.loads(run("security-group", "rule-create", "web", "--direction", "ingress", "--protocol", "tcp",
                          "--port", "8000-8080", "--json").output)
    assert (rule["port_range_min"], rule["port_range_max"], rule["protocol"]) == (8000, 8080, "tcp")
    run("security-group", "rule-create", "web", "--direction", "ingress", "--protocol", "icmp",
        "--icmp-type", "8", "--remote-ip-prefix", "10.1.0.0/16")
    shown = run("security-group", "show", "web").output
    assert "8000-8080" in shown and "type 8" in shown and "10.1.0.0/16" in shown
    assert len(json.loads(run("security-group", "rule-list", "web", "--json").output)) == 2
    port = json.loads(run("port", "create", "vm1", "--network", "blue", "--security-group", "web", "--json").output)
    assert port["security_groups"] == [web["id"]]
    # a port created without groups joins the default group (made then)
    vm2 = json.loads(run("port", "create", "vm2", "--network", "blue", "--json").output)
    groups = json.loads(run("security-group", "list", "--json").output)
    assert vm2["security_groups"] == [next(g["id"] for g in groups if g["name"] == "default")]
    assert "default" in run("security-group", "list").output
    out = run("security-group", "delete", "web", ok=False).output
    assert out.startswith("error: 409 conflict") and "in use" in out
    off = json.loads(run("port", "update", "vm1", "--no-port-security", "--json").output)
    assert (off["port_security"], off["security_groups"]) == (False, [])
    assert "deleted security group rule" in run("security-group", "rule-delete", str(rule["id"])).output
    assert f"deleted security-group {web['id']}" in run("security-group", "delete", "web").output
    out = run("security-group", "rule-create", "default", "--direction", "ingress", "--port", "80", ok=False).output
    assert out.startswith("error: 422") and "port_range_min" in out
