"""The resource CLI verbs against the API app in-process (no server): output and one-line errors."""
from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner

from fathom.api import create_app
from fathom.cli import resources
from fathom.cli.main import cli

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


@pytest.fixture
def run(tmp_path, monkeypatch):
    app = create_app(f"sqlite:///{tmp_path / 'cli.db'}")
    # The CLI's httpx.Client becomes a TestClient talking to the app in-process.
    monkeypatch.setattr(resources.httpx, "Client",
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
    run("port", "create", "vm1", "--network", "blue", "--ip", "10.0.0.11", "--node", "c1",
        "--interface", "tap1")
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
    run("port", "create", "a", "--network", "blue", "--ip", "10.0.0.5")
    out = run("port", "create", "b", "--network", "blue", "--ip", "10.0.0.5", ok=False).output
    assert out.strip() == "error: 409 conflict: fixed_ips.0.ip_address: 10.0.0.5 is in use in network 1"
    assert "no network named 'nope'" in run("network", "show", "nope", ok=False).output
    run("network", "create", "blue")
    assert "use an id" in run("network", "show", "blue", ok=False).output


def test_unreachable_controller():
    result = CliRunner().invoke(cli, ["network", "list", "--controller", "http://127.0.0.1:1"])
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot reach the controller at http://127.0.0.1:1")
