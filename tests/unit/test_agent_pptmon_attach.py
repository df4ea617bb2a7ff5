"""The agent's wait for a loader to attach: a loader whose programs take long to verify (a crowded
host) is waited for, not given up on (which would leave its chain `error` until the next resync); one
that exits says why."""
from __future__ import annotations

import subprocess

import pytest

from fathom.agent.pptmon import Pptmon


def _loader(tmp_path, script: str) -> tuple:
    records, err = tmp_path / "vnf1.jsonl", tmp_path / "vnf1.err"
    with open(records, "ab") as out, open(err, "wb") as e:
        p = subprocess.Popen(["sh", "-c", script], stdout=out, stderr=e)
    return records, err, p


def test_a_loader_slower_than_five_seconds_is_waited_for(tmp_path):
    records, err, p = _loader(tmp_path, 'sleep 6; echo "{\\"type\\":\\"attached\\",\\"pid\\":$$}"; sleep 30')
    try:
        Pptmon._wait_attached(records, err, p)
        assert p.poll() is None, "the loader was given up on"
    finally:
        p.kill()
        p.wait()


def test_a_loader_that_exits_says_why(tmp_path):
    records, err, p = _loader(tmp_path, "echo 'libbpf: no BTF' >&2; exit 1")
    with pytest.raises(RuntimeError, match="pptmon-loader exited: libbpf: no BTF"):
        Pptmon._wait_attached(records, err, p)
