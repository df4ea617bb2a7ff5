"""The resource CLI verbs against the API app in-process (no server): output and one-line errors."""
from __future__ import annotations

import json
import time
import os
import warnings

import pytest
from click.testing import CliRunner

from fathom.api import create_app
from fathom import client as client_module
from fathom.cli.main import cli

from .auth import headers_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


@pytest.fixture
def run(tmp_path, monkeypatch):
    app = create_app(f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("FATHOM_TOKEN", headers_for(app)["Authorization"].split()[1])
    # The CLI's httpx.Client becomes a TestClient talking to the app in-process.
    monkeypatch.setattr(client_module.httpx, "Client",
                        lambda base_url, headers, timeout: TestClient(app, base_url=base_url, headers=headers))
    runner = CliRunner()

    def invoke(*args, ok=True):
        result = runner.invoke(cli, list(args), catch_exceptions=False)
        assert (result.exit_code == 0) == ok, result.output
        return result
    yield invoke
    app.state.engine.dispose()


def test_create_list_show_delete(run):
    run("node", "create", "c1", "--tunnel-ip", "198.18.0.1")
    run("network", "create", "blue")
    run("subnet", "create", "blue4", "--network", "blue", "--cidr", "10.0.0.0/24")
    run("port", "create", "vm1", "--network", "blue", "--fixed-ip", "10.0.0.11", "--node", "c1",
        "--interface-name", "tap1")
    run("router", "create", "r1")
    run("router", "add-interface", "r1", "blue4")
    ports = json.loads(run("port", "list", "--json").output)
    assert [(p["name"], p["fixed_ips"][0]["ip_address"]) for p in ports] == [("vm1", "10.0.0.11"),
                                                                           ("router-1", "10.0.0.1")]
    table = run("port", "list", "--network", "blue").output
    assert "vm1" in table and "10.0.0.11" in table
    assert json.loads(run("network", "show", "blue", "--json").output)["segmentation_id"] == 5000
    assert "interfaces" in run("router", "show", "r1").output
    run("router", "remove-interface", "r1", "blue4")
    assert "deleted port" in run("port", "delete", "vm1").output
    run("network", "delete", "blue")
    assert json.loads(run("network", "list", "--json").output) == []


def test_errors_are_one_line_with_the_field(run):
    run("network", "create", "blue")
    out = run("subnet", "create", "bad", "--network", "blue", "--cidr", "10.0.0.1/24", ok=False).output
    assert out.strip() == "error: 422 unprocessable entity: cidr: 10.0.0.1/24 has host bits set"
    run("subnet", "create", "ok", "--network", "blue", "--cidr", "10.0.0.0/24")
    run("port", "create", "a", "--network", "blue", "--fixed-ip", "10.0.0.5")
    out = run("port", "create", "b", "--network", "blue", "--fixed-ip", "10.0.0.5", ok=False).output
    assert out.strip() == "error: 409 conflict: fixed_ips.0.ip_address: 10.0.0.5 is in use in network 1"
    assert "no network named 'nope'" in run("network", "show", "nope", ok=False).output
    run("network", "create", "blue")
    assert "use an id" in run("network", "show", "blue", ok=False).output


def test_tokens_create_list_use_revoke(run, tmp_path, monkeypatch):
    admin = os.environ["FATHOM_TOKEN"]
    made = json.loads(run("token", "create", "--project-id", "p1", "--role", "member", "--expires", "1d",
                          "--json").output)
    assert made["roles"] == ["member"] and made["token"].startswith("fth_") and made["expires_at"]
    listed = json.loads(run("token", "list", "--json").output)
    assert made["id"] in [t["id"] for t in listed] and all("token" not in t for t in listed)
    path = tmp_path / "p1.token"
    run("token", "create", "--project-id", "p1", "--role", "member", "--output", str(path))
    assert path.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("FATHOM_TOKEN", made["token"])
    run("network", "create", "mine")
    assert json.loads(run("network", "show", "mine", "--json").output)["project_id"] == "p1"
    assert "403" in run("token", "list", ok=False).output           # members manage no tokens
    monkeypatch.delenv("FATHOM_TOKEN")
    monkeypatch.setenv("FATHOM_TOKEN_FILE", str(path))               # the file a token was written to
    assert json.loads(run("network", "list", "--json").output)[0]["name"] == "mine"
    monkeypatch.setenv("FATHOM_TOKEN", admin)
    run("token", "revoke", str(made["id"]))
    monkeypatch.setenv("FATHOM_TOKEN", made["token"])
    assert "401" in run("network", "list", ok=False).output           # revoked: refused at once


def test_unreachable_controller(monkeypatch):
    monkeypatch.setenv("FATHOM_TOKEN", "fth_x")
    result = CliRunner().invoke(cli, ["network", "list", "--controller", "http://127.0.0.1:1"])
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot reach the controller at http://127.0.0.1:1")


def test_update_for_every_resource_with_patch(run):
    """Every resource whose API has PATCH has `fathom <resource> update`, changing only what is given."""
    run("node", "create", "c1", "--tunnel-ip", "198.18.0.1")
    run("node", "create", "g1", "--role", "gateway")
    node = json.loads(run("node", "update", "c1", "--management-ip", "198.18.0.9", "--json").output)
    assert (node["management_ip"], node["tunnel_ip"], node["role"]) == ("198.18.0.9", "198.18.0.1", "compute")
    run("network", "create", "blue")
    assert json.loads(run("network", "update", "blue", "--name", "navy", "--json").output)["name"] == "navy"
    run("subnet", "create", "blue4", "--network", "navy", "--cidr", "10.0.0.0/24")
    assert json.loads(run("subnet", "update", "blue4", "--name", "n4", "--json").output)["name"] == "n4"
    run("port", "create", "vm1", "--network", "navy")
    port = json.loads(run("port", "update", "vm1", "--node", "c1", "--interface-name", "tap1", "--no-port-security",
                          "--json").output)
    assert (port["node"], port["interface_name"], port["port_security"], port["name"]) == ("c1", "tap1", False, "vm1")
    port = json.loads(run("port", "update", "vm1", "--node", "none", "--interface-name", "none", "--json").output)
    assert (port["node"], port["interface_name"]) == (None, None)
    run("router", "create", "r1")
    router = json.loads(run("router", "update", "r1", "--mode", "network-node", "--json").output)
    assert (router["mode"], router["gateway_node"]) == ("network-node", "g1")
    router = json.loads(run("router", "update", "r1", "--name", "r2", "--json").output)
    assert (router["name"], router["mode"]) == ("r2", "network-node")
    out = run("router", "update", "r2", "--mode", "fabric", ok=False).output
    assert out.startswith("error: 409 conflict: mode:")


def test_tap_show_without_the_controller_runtime(run):
    """`tap show` prints the policy; its counters come from the controller runtime, which an API
    served alone does not have (404): the policy is shown without them."""
    run("network", "create", "blue")
    run("subnet", "create", "blue4", "--network", "blue", "--cidr", "10.0.0.0/24")
    for name in ("a", "b", "mon"):
        run("port", "create", name, "--network", "blue")
    out = json.loads(run("tap", "create", "t1", "--sender", "a", "--receiver", "b", "--monitor", "mon",
                         "--ip-proto", "tcp", "--tp-dst", "80", "--direction", "both", "--json").output)
    assert (out["direction"], out["filters"]) == ("both", {"ip_proto": 6, "tp_dst": "80"})
    shown = json.loads(run("tap", "show", "t1", "--json").output)
    assert shown["id"] == out["id"] and "stats" not in shown
    assert "tap policy" in run("tap", "show", "t1").output
    out = json.loads(run("tap", "update", "t1", "--tp-dst", "8000-8100", "--json").output)
    assert out["filters"]["tp_dst"] == "8000-8100"


def _external_and_blue(run) -> None:
    """Nodes c1 and gw (the gateway), an external network ext (203.0.113.0/24) and a tenant network
    blue (10.0.0.0/24)."""
    run("node", "create", "c1", "--tunnel-ip", "198.18.0.1")
    run("node", "create", "gw", "--role", "gateway", "--tunnel-ip", "198.18.0.9")
    run("network", "create", "ext", "--type", "flat", "--external", "--upstream-mac", "02:fe:00:00:00:01")
    run("subnet", "create", "ext4", "--network", "ext", "--cidr", "203.0.113.0/24")
    run("network", "create", "blue")
    run("subnet", "create", "blue4", "--network", "blue", "--cidr", "10.0.0.0/24")


def test_external_gateway_and_floating_ips(run):
    _external_and_blue(run)
    run("port", "create", "vm1", "--network", "blue", "--node", "c1", "--interface-name", "tap1")
    run("port", "create", "vm2", "--network", "blue", "--node", "c1", "--interface-name", "tap2")
    run("router", "create", "r1", "--external-network", "ext")
    run("router", "add-interface", "r1", "blue4")
    assert "203.0.113.2 on gw" in run("router", "list").output
    assert "snat on" in run("router", "show", "r1").output
    fip = json.loads(run("floatingip", "create", "ext", "--port", "vm1", "--name", "web", "--json").output)
    assert (fip["floating_ip_address"], fip["fixed_ip_address"]) == ("203.0.113.3", "10.0.0.2")
    assert "203.0.113.3" in run("floatingip", "list").output
    moved = json.loads(run("floatingip", "associate", "web", "vm2", "--fixed-ip-address", "10.0.0.3", "--json").output)
    assert moved["fixed_ip_address"] == "10.0.0.3"
    assert "no port named 'nope'" in run("floatingip", "associate", "web", "nope", ok=False).output
    assert json.loads(run("floatingip", "disassociate", "web", "--json").output)["port_id"] is None
    assert "not a workload port" in run("floatingip", "create", "ext", "--port", "router-1", ok=False).output
    run("router", "update", "r1", "--clear-gateway")
    assert json.loads(run("router", "show", "r1", "--json").output)["external_gateway"] is None
    assert "deleted floating IP" in run("floatingip", "delete", "web").output


def test_old_option_spellings_work_hidden_and_warn(run):
    """Each option renamed to the API's name keeps its old spelling for one release: it does what
    the new one does, --help does not show it, and using it prints a deprecation note on stderr."""
    _external_and_blue(run)
    run("router", "create", "r1", "--external-network", "ext")
    run("port", "create", "vm", "--network", "blue", "--node", "c1", "--interface-name", "vm")
    cases = [   # (old, new, the command with the old spelling, what its JSON answer must show)
        ("--owner", "--project-id", ["network", "create", "n2", "--owner", "p9"], {"project_id": "p9"}),
        ("--mac", "--mac-address", ["port", "create", "p1", "--network", "blue", "--mac", "02:00:00:00:00:09"],
         {"mac_address": "02:00:00:00:00:09"}),
        ("--ip", "--fixed-ip", ["port", "create", "p2", "--network", "blue", "--ip", "10.0.0.9"],
         {"fixed_ips": [{"subnet_id": 2, "ip_address": "10.0.0.9"}]}),
        ("--no-ip", "--no-fixed-ip", ["port", "create", "p3", "--network", "blue", "--no-ip"], {"fixed_ips": []}),
        ("--interface", "--interface-name", ["port", "update", "vm", "--interface", "tap9"], {"interface_name": "tap9"}),
        ("--gateway", "--gateway-ip", ["subnet", "create", "s2", "--network", "n2", "--cidr", "10.1.0.0/24",
                                       "--gateway", "10.1.0.254"], {"gateway_ip": "10.1.0.254"}),
        ("--dns", "--dns-nameserver", ["subnet", "update", "blue4", "--dns", "192.0.2.53"],
         {"dns_nameservers": ["192.0.2.53"]}),
        ("--no-dns", "--no-dns-nameservers", ["subnet", "update", "blue4", "--no-dns"], {"dns_nameservers": []}),
        ("--ip", "--ip-address", ["router", "add-interface", "r1", "blue4", "--ip", "10.0.0.254"],
         {"ip_address": "10.0.0.254"}),
        ("--ip", "--floating-ip-address", ["floatingip", "create", "ext", "--ip", "203.0.113.9", "--name", "f"],
         {"floating_ip_address": "203.0.113.9"}),
        ("--fixed-ip", "--fixed-ip-address", ["floatingip", "associate", "f", "vm", "--fixed-ip", "10.0.0.2"],
         {"fixed_ip_address": "10.0.0.2"}),
    ]
    for old, new, args, want in cases:
        result = run(*args, "--json")
        got = json.loads(result.stdout)
        assert {k: got[k] for k in want} == want, args
        assert result.stderr == f"warning: {old} is deprecated and will be removed: use {new}\n"
        shown = run(*args[:2], "--help").output
        assert new in shown and f"{old} " not in shown and f"{old}," not in shown, args
    out = run("port", "create", "p4", "--network", "blue", "--ip", "10.0.0.7", "--fixed-ip", "10.0.0.8", ok=False)
    assert "--ip is the old spelling of --fixed-ip: give one of them" in out.stderr


def test_old_lab_option_spellings_reach_the_lab():
    """`lab plug|upstream --mac` still give the MAC (the command gets as far as the lab, which does
    not exist here), with the deprecation note."""
    for args in (["lab", "upstream", "-n", "nm0", "--mac", "02:fe:00:00:00:01", "--address", "198.18.9.1/24"],
                 ["lab", "plug", "-n", "nm0", "--os-vif", "--node", "c1", "--mac", "02:00:00:00:00:01",
                  "--neutron-port", "u1"]):
        result = CliRunner().invoke(cli, args)
        assert result.stderr.startswith("warning: --mac is deprecated and will be removed: use --mac-address\n")
        assert "lab nm0" in result.stderr and "Missing" not in result.stderr and "needs" not in result.stderr, args


def test_sfc_verbs(run):
    """`fathom sfc ...`: a chain built from the CLI, shown in tables and JSON, changed and deleted."""
    run("node", "create", "c1", "--tunnel-ip", "198.18.0.1")
    run("network", "create", "blue")
    run("subnet", "create", "blue4", "--network", "blue", "--cidr", "10.0.0.0/24")
    for i, name in enumerate(("client", "server", "fwi", "fwo"), start=11):
        run("port", "create", name, "--network", "blue", "--fixed-ip", f"10.0.0.{i}", "--node", "c1", "--interface-name", name,
            *(["--no-port-security"] if name.startswith("fw") else []))
    run("sfc", "port-pair", "create", "fw", "--ingress", "fwi", "--egress", "fwo")
    run("sfc", "port-pair-group", "create", "fws", "--port-pair", "fw")
    run("sfc", "flow-classifier", "create", "web", "--logical-source-port", "client", "--logical-destination-port",
        "server", "--protocol", "tcp", "--destination-port", "80")
    chain = json.loads(run("sfc", "port-chain", "create", "c", "--port-pair-group", "fws", "--flow-classifier", "web",
                           "--symmetric", "--json").output)
    assert chain["chain_parameters"]["symmetric"] and len(chain["port_pair_groups"]) == 1
    assert "80 → " not in run("sfc", "flow-classifier", "list").output
    assert "* → 80" in run("sfc", "flow-classifier", "list").output
    assert json.loads(run("sfc", "port-chain", "list", "--json").output)[0]["name"] == "c"
    out = run("sfc", "port-chain", "update", "c", "--no-flow-classifiers", "--json").output
    assert json.loads(out)["flow_classifiers"] == []
    # PPTMon on the chain: one name, `pptmon`, from the CLI to the API
    assert chain["pptmon"] is None and "off" in run("sfc", "port-chain", "list").output
    out = json.loads(run("sfc", "port-chain", "update", "c", "--pptmon", "10ms", "--json").output)
    assert out["pptmon"] == {"period_ns": 10_000_000}
    assert "1 per 0.01 s" in run("sfc", "port-chain", "list").output
    stats = json.loads(run("sfc", "port-chain", "pptmon", "c", "--window", "1m", "--json").output)
    assert stats["records"] == 0 and [g["role"] for g in stats["groups"]] == ["source-sink"]
    table = run("sfc", "port-chain", "pptmon", "c").output
    assert "group fws (source-sink)" in table and "port pair fw (vnf 1)" in table and "end-to-end" in table
    assert "--pptmon" in run("sfc", "port-chain", "update", "c", "--pptmon", "soon", ok=False).output
    assert json.loads(run("sfc", "port-chain", "update", "c", "--no-pptmon", "--json").output)["pptmon"] is None
    err = run("sfc", "port-pair", "delete", "fw", ok=False).output
    assert "port pair group" in err and len(err.strip().splitlines()) == 1
    run("sfc", "port-chain", "delete", "c")
    run("sfc", "port-pair-group", "delete", "fws")
    run("sfc", "port-pair", "delete", "fw")
    assert json.loads(run("sfc", "port-pair", "list", "--json").output) == []


def test_wait_returns_once_the_controller_says_active_or_fails(tmp_path, monkeypatch):
    """`--wait` long-polls the status board of the controller in the API's process."""
    import threading
    from fathom.controller.board import StatusBoard
    app = create_app(f"sqlite:///{tmp_path / 'cli.db'}")
    app.state.status_board = board = StatusBoard()
    monkeypatch.setenv("FATHOM_TOKEN", headers_for(app)["Authorization"].split()[1])
    monkeypatch.setattr(client_module.httpx, "Client",
                        lambda base_url, headers, timeout: TestClient(app, base_url=base_url, headers=headers))
    runner = CliRunner()
    try:
        # nothing decides the network's status: the wait runs out, exit status 1
        result = runner.invoke(cli, ["network", "create", "blue", "--wait", "--timeout", "0.3"])
        assert result.exit_code == 1 and "not 'active' after 0.3 s" in result.output, result.output
        # a pass writes it active and publishes it (what the reconciler does): the wait ends then
        def reconciled():   # once the network is made (the CLI may take longer than the timer)
            from sqlalchemy.orm import Session
            from fathom.store import models as m
            from fathom.store.status import set_status
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with Session(app.state.engine) as s, s.begin():
                    if s.get(m.Network, 2) is not None:
                        set_status(s, "network", 2, "active")
                        break
                time.sleep(0.05)
            board.publish({("network", 2): ("active", None)}, 0)
        threading.Timer(0.3, reconciled).start()
        result = runner.invoke(cli, ["network", "create", "green", "--wait", "--timeout", "10", "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["status"] == "active"

        # the chain commands too (GET /v1/sfc/port_chains/<id>?wait=active)
        def ok(*args):
            result = runner.invoke(cli, list(args))
            assert result.exit_code == 0, result.output
            return result.output
        ok("node", "create", "c1", "--tunnel-ip", "198.18.0.1")
        ok("subnet", "create", "green4", "--network", "green", "--cidr", "10.0.0.0/24")
        for name in ("fwi", "fwo"):
            ok("port", "create", name, "--network", "green", "--node", "c1", "--interface-name", name, "--no-port-security")
        ok("sfc", "port-pair", "create", "fw", "--ingress", "fwi", "--egress", "fwo")
        ok("sfc", "port-pair-group", "create", "fws", "--port-pair", "fw")
        chain = json.loads(ok("sfc", "port-chain", "create", "c", "--port-pair-group", "fws", "--json"))
        result = runner.invoke(cli, ["sfc", "port-chain", "update", "c", "--pptmon", "1ms", "--wait", "--timeout", "0.3"])
        assert result.exit_code == 1 and "not 'active' after 0.3 s" in result.output, result.output
        def chain_reconciled():
            from sqlalchemy.orm import Session
            from fathom.store.status import set_status
            with Session(app.state.engine) as s, s.begin():
                set_status(s, "port_chain", chain["id"], "active")
            board.publish({("port_chain", chain["id"]): ("active", None)}, 0)
        threading.Timer(0.3, chain_reconciled).start()
        out = json.loads(ok("sfc", "port-chain", "update", "c", "--no-pptmon", "--wait", "--timeout", "10", "--json"))
        assert out["status"] == "active" and out["pptmon"] is None
    finally:
        app.state.engine.dispose()


def test_subnet_dhcp_options(run):
    run("network", "create", "blue")
    got = json.loads(run("subnet", "create", "s", "--network", "blue", "--cidr", "10.0.0.0/24",
                         "--dns-nameserver", "192.0.2.53", "--host-route", "203.0.113.0/24,10.0.0.5", "--json").output)
    assert got["enable_dhcp"] and got["dns_nameservers"] == ["192.0.2.53"]
    assert got["host_routes"] == [{"destination": "203.0.113.0/24", "nexthop": "10.0.0.5"}]
    got = json.loads(run("subnet", "update", "s", "--dns-nameserver", "192.0.2.54", "--dns-nameserver", "192.0.2.55",
                         "--json").output)
    assert got["dns_nameservers"] == ["192.0.2.54", "192.0.2.55"] and len(got["host_routes"]) == 1
    got = json.loads(run("subnet", "update", "s", "--no-host-routes", "--no-dhcp", "--json").output)
    assert got["host_routes"] == [] and got["enable_dhcp"] is False and got["dns_nameservers"] == ["192.0.2.54", "192.0.2.55"]
    assert "off" in run("subnet", "list").output
    out = run("subnet", "update", "s", "--host-route", "198.51.100.0/24,10.9.0.1", ok=False).output
    assert out.strip() == "error: 422 unprocessable entity: host_routes.0.nexthop: 10.9.0.1 is outside the subnet 10.0.0.0/24"
    assert "DESTINATION,NEXTHOP" in run("subnet", "update", "s", "--host-route", "198.51.100.0/24", ok=False).output
    assert "nothing to change" in run("subnet", "update", "s", ok=False).output


def test_tables_escape_control_characters_and_json_stays_exact(run):
    """A name is the tenant's text: an ESC or a C1 CSI would rewrite the operator's terminal, a bidi
    override reorder it, rich markup restyle it. Tables and error lines show them escaped."""
    name = "evil\x1b[2J\x1b]0;owned\x07\x9b31m\x7f\u202egnp.exe[red]x[/red]"
    run("network", "create", name)
    raw = set("\x1b\x07\x9b\x7f\u202e")
    for args in (("network", "list"), ("network", "show", name), ("network", "delete", "nosuch")):
        out = run(*args, ok=args[1] != "delete").output
        assert not raw & set(out), (args, out)
    table = run("network", "list").output
    assert "evil\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\x7f\\u202egnp.exe[red]x[/red]" in table
    err = run("network", "show", "\x1b[31mnope", ok=False).output
    assert "\\x1b[31mnope" in err and "\x1b" not in err
    assert json.loads(run("network", "list", "--json").output)[0]["name"] == name
    assert "\x1b" not in run("network", "list", "--json").output       # JSON's own \u001b escape
    assert "deleted network" in (out := run("network", "delete", name).output) and not raw & set(out)
