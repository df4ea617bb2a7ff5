"""The agent's wait for a loader to attach: a loader whose programs take long to verify (a crowded
host) is waited for, not given up on (which would leave its chain `error` until the next resync); one
still loading after the wait is `pending` until it attaches; one that exits says why (`error`)."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from fathom.agent import pptmon as agent_pptmon
from fathom.agent.pptmon import Pptmon
from fathom.model.hostlocal import PptmonAttach, digest, owner_key


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


# ----- through Pptmon.apply, with a stand-in loader (a shell script by the loader's name: the
# agent recognises its loaders by their command line) whose load takes longer than the wait

def _stand_in(tmp_path, monkeypatch, load: str) -> Pptmon:
    """A Pptmon whose loader runs `load` (shell) before it says it attached; `detach` does nothing."""
    loader = tmp_path / "bin" / "pptmon-loader"
    loader.parent.mkdir()
    loader.write_text(
        '#!/bin/sh\n[ "$1" = run ] || exit 0\n'
        f'{load}\n'
        'echo "{\\"type\\":\\"attached\\",\\"pid\\":$$}"\n'
        "trap 'kill $!; exit 0' TERM\nsleep 60 & wait\n")
    loader.chmod(0o755)
    monkeypatch.setattr(agent_pptmon.native, "LOADER", loader)
    monkeypatch.setattr(agent_pptmon, "ATTACH_TIMEOUT", 0.3)
    pm = Pptmon(tmp_path / "root", tmp_path / "state", tmp_path / "bpffs", "n1")
    monkeypatch.setattr(pm, "_bpffs", lambda: None)
    return pm


ATTACHMENT = PptmonAttach(1, "c1", 1, "source-sink", "lo:egress", "lo:ingress", 10**9)


def _until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_loader_still_loading_after_the_wait_is_pending_then_active(tmp_path, monkeypatch):
    pm = _stand_in(tmp_path, monkeypatch, "sleep 1.5")
    key = owner_key(ATTACHMENT.owner)
    try:
        st = pm.apply([ATTACHMENT])[key]
        assert st["status"] == "pending" and "still loading" in st["reason"], st
        held = json.loads((tmp_path / "state" / "pptmon" / "1.json").read_text())
        assert Pptmon._is_loader(held["pid"], held["pin"]), "the loader was given up on"
        records = tmp_path / "root" / "c1" / "vnf1-a1.jsonl"
        _until(lambda: b'"attached"' in records.read_bytes())
        assert pm.apply([ATTACHMENT])[key] == {"status": "active", "reason": None, "applied": digest([ATTACHMENT])}
        assert json.loads((tmp_path / "state" / "pptmon" / "1.json").read_text())["pid"] == held["pid"], \
            "started again"
    finally:
        pm.apply([])
    assert pm.held() == set()


def test_a_loader_that_fails_while_pending_is_an_error_with_its_reason(tmp_path, monkeypatch):
    pm = _stand_in(tmp_path, monkeypatch, "sleep 1; echo 'libbpf: prog ppt_in: verifier: -E2BIG' >&2; exit 1")
    key = owner_key(ATTACHMENT.owner)
    try:
        assert pm.apply([ATTACHMENT])[key]["status"] == "pending"
        held = json.loads((tmp_path / "state" / "pptmon" / "1.json").read_text())
        _until(lambda: not Pptmon._is_loader(held["pid"], held["pin"]))
        st = pm.apply([ATTACHMENT])[key]
        assert st["status"] == "error"
        assert st["reason"] == "pptmon-loader exited while loading: libbpf: prog ppt_in: verifier: -E2BIG"
        assert pm.held() == set(), "the failed loader's state stays behind: it would never be started again"
    finally:
        pm.apply([])


def test_a_loader_that_fails_within_the_wait_is_an_error_with_its_reason(tmp_path, monkeypatch):
    pm = _stand_in(tmp_path, monkeypatch, "echo 'pptmon-loader: load: Operation not permitted' >&2; exit 1")
    monkeypatch.setattr(agent_pptmon, "ATTACH_TIMEOUT", 10.0)
    st = pm.apply([ATTACHMENT])[owner_key(ATTACHMENT.owner)]
    assert st["status"] == "error"
    assert st["reason"] == "pptmon-loader exited: pptmon-loader: load: Operation not permitted"
