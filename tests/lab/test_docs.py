"""The docs are the tests' scripts: the command blocks a reader is told to run, extracted from the
Markdown and run as written, in order, in one shell (bash -e, from the repository's directory).

A block is run when its fence says so: ```` ```sh doctest ```` (GitHub shows it as `sh`), followed
by where it runs when a doc spans several hosts (docs/deploy.md: ```` ```sh doctest node ````).
Substitutions, the only ones: the lab name a doc chooses (`export FATHOM_LAB=<name>`) becomes this
test's, so that the test's lab never meets a reader's; deploy.md's example node compute1 becomes each
node in turn (below).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fathom.lab.lab import Lab
from fathom.lab.neutron import available

from .deploy_hosts import Host, make_shims, wire

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```sh doctest ?(\w*)\n(.*?)^```$", re.S | re.M)   # (where it runs, the commands)
LAB_LINE = re.compile(r"^export FATHOM_LAB=\S+", re.M)


def script(doc: Path, lab: str) -> str:
    """The doc's `sh doctest` blocks, in order, with the doc's lab name replaced by `lab`."""
    blocks = [text for where, text in BLOCK.findall(doc.read_text()) if not where]
    assert blocks, f"{doc} has no `sh doctest` block"
    text = "\n".join(blocks)
    assert len(LAB_LINE.findall(text)) == 1, f"{doc}: one `export FATHOM_LAB=` line, in the first block"
    return LAB_LINE.sub(f"export FATHOM_LAB={lab}", text)


def test_blocks_are_extracted_in_order(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("text\n```sh doctest\nexport FATHOM_LAB=os\necho one\n```\n```sh\nnot run\n```\n"
                   "```sh doctest node\nelsewhere\n```\n```sh doctest\necho two\n```\n")
    assert script(doc, "zo9") == "export FATHOM_LAB=zo9\necho one\n\necho two\n"


def run_doc(doc: Path, lab: str, timeout: float = 900) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FATHOM_", "OS_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    Lab(lab).down()  # a lab left by a run that was killed must not fail this one
    try:
        out = subprocess.run(["bash", "-e", "-x", "-c", script(doc, lab)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"{doc.name} failed ({out.returncode}):\n{out.stderr[-6000:]}\n{out.stdout[-3000:]}"
    finally:
        Lab(lab).down()


def test_openstack_md_step_by_step():
    """docs/openstack.md, "Trying it on one machine": lab, Neutron from .venv-neutron (schema,
    gunicorn), VMs plugged as os-vif does that take their address by DHCP and ping, an upstream
    host pinging a floating IP, a second project through the SDK, a controller restart."""
    why = available()
    if why:
        pytest.fail(why)
    run_doc(ROOT / "docs" / "openstack.md", "zo1")


# docs/deploy.md on three hosts: its blocks are tagged with where they run (`sh doctest controller`,
# `register`: on the controller host for each node, `node`: on each node, `check`: on the controller
# host at the end). The doc's example node is compute1 (management 198.18.128.11, tunnel
# 198.18.0.11); for compute2 those three are replaced by its own.
DEPLOY_NODES = {"compute1": ("198.18.128.11", "198.18.0.11"), "compute2": ("198.18.128.12", "198.18.0.12")}


def for_node(text: str, node: str) -> str:
    mgmt, tunnel = DEPLOY_NODES[node]
    return (text.replace("compute1", node).replace("198.18.128.11", mgmt).replace("198.18.0.11", tunnel))


def test_deploy_md_on_a_controller_host_and_two_nodes(tmp_path):
    """docs/deploy.md as written, on hosts that share nothing but the kernel (tests/lab/deploy_hosts.py):
    the controller host (PKI, HAProxy as the TLS proxy, the systemd unit), two nodes registered, their
    files copied over, their OVS (packaged ovs-ctl) and agents; then the doc's checks, every node
    active, and the nodes' tunnel addresses reaching each other over br-phy."""
    blocks = BLOCK.findall((ROOT / "docs" / "deploy.md").read_text())
    assert {tag for tag, _ in blocks} == {"controller", "register", "node", "check"}, blocks
    shims = make_shims(tmp_path)
    hosts = {name: Host("zo2", name, shims) for name in ("controller", *DEPLOY_NODES)}
    ctl = hosts["controller"]

    def do(host, text, timeout=120):
        out = host.sh(text, timeout)
        assert out.returncode == 0, f"on {host.name}:\n{text}\n--- stderr\n{out.stderr[-3000:]}\n--- stdout\n{out.stdout[-2000:]}"
        return out.stdout

    try:
        wire("zo2", hosts, {"controller": "198.18.128.1", **{n: m for n, (m, _) in DEPLOY_NODES.items()}},
             list(DEPLOY_NODES))
        ctl.start("/opt/fathom")           # the doc's `cd /opt/fathom`
        for node in DEPLOY_NODES:
            hosts[node].start("/root")     # where the node's files are copied to
        for tag, text in blocks:
            if tag == "controller":
                do(ctl, text)
        for node in DEPLOY_NODES:
            for tag, text in blocks:
                if tag == "register":
                    do(ctl, for_node(text, node))
            # the doc's copy step ("Copy to the node (here into the current directory there)")
            for src in (f"/etc/fathom/pki/private/{node}.key", f"/etc/fathom/pki/certs/{node}.pem",
                        "/etc/fathom/pki/controllerca/trust.pem", "/etc/fathom/api-cert.pem", f"/root/{node}-agent-token"):
                shutil.copy(ctl.path(src), hosts[node].path(f"/root/{Path(src).name}"))
            for tag, text in blocks:
                if tag == "node":
                    do(hosts[node], for_node(text, node))
        deadline = time.monotonic() + 90
        while True:
            nodes = json.loads(do(ctl, "fathom node list --json"))
            if len(nodes) == 2 and all(n.get("status") == "active" for n in nodes):
                break
            assert time.monotonic() < deadline, f"nodes not active: {nodes}"
            time.sleep(1)
        for tag, text in blocks:
            if tag == "check":
                do(ctl, text)
        for node, (_, tunnel) in DEPLOY_NODES.items():
            assert f"{tunnel}/24" in do(hosts[node], "ip -br addr show dev br-phy")
        do(hosts["compute1"], f"ping -c 3 -w 20 {DEPLOY_NODES['compute2'][1]}")
    finally:
        for h in hosts.values():
            h.stop()
        subprocess.run(["ip", "netns", "del", "zo2-sw"], capture_output=True)


def test_trace_md():
    """docs/trace.md: the simulated verdict agrees with ping in the default lab, delivered and then
    dropped by a security group."""
    run_doc(ROOT / "docs" / "trace.md", "tr1", timeout=300)


def test_flow_records_md():
    """docs/flow-records.md: sampling on the default lab; a ping admitted by its rule, a refused
    attempt named as a default drop, top talkers, the ping leaving compute1 through the tunnel."""
    run_doc(ROOT / "docs" / "flow-records.md", "qe3", timeout=300)
