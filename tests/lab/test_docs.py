"""The docs are the tests' scripts: the command blocks a reader is told to run, extracted from the
Markdown and run as written, in order, in one shell (bash -e, from the repository's directory).

A block is run when its fence says so: ```` ```sh doctest ```` (GitHub shows it as `sh`). The one
substitution: the lab name a doc chooses (`export FATHOM_LAB=<name>`) becomes this test's, so that
the test's lab never meets a reader's.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fathom.lab.lab import Lab
from fathom.lab.neutron import available

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```sh doctest\n(.*?)^```$", re.S | re.M)
LAB_LINE = re.compile(r"^export FATHOM_LAB=\S+", re.M)


def script(doc: Path, lab: str) -> str:
    """The doc's `sh doctest` blocks, in order, with the doc's lab name replaced by `lab`."""
    blocks = BLOCK.findall(doc.read_text())
    assert blocks, f"{doc} has no `sh doctest` block"
    text = "\n".join(blocks)
    assert len(LAB_LINE.findall(text)) == 1, f"{doc}: one `export FATHOM_LAB=` line, in the first block"
    return LAB_LINE.sub(f"export FATHOM_LAB={lab}", text)


def test_blocks_are_extracted_in_order(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("text\n```sh doctest\nexport FATHOM_LAB=os\necho one\n```\n```sh\nnot run\n```\n"
                   "```sh doctest\necho two\n```\n")
    assert script(doc, "zo9") == "export FATHOM_LAB=zo9\necho one\n\necho two\n"


def run_doc(doc: Path, lab: str, timeout: float = 900) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FATHOM_", "OS_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
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
