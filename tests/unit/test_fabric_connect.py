"""A fabric switch's OVSDB connection is made beside the passes: a pass waits SETUP_WAIT for it at most, so a
fabric switch that takes the connection and never answers (or a dead one) does not hold up the changes of the
rest of the cloud; the connection's end, made or failed, wakes a pass, which takes it. Against a
listener that never answers and a real ovsdb-server."""
from __future__ import annotations

import random
import socket
import time
from types import SimpleNamespace

import pytest

from fathom.apps import FABRIC_SWITCH, SwitchKey
from fathom.controller import channels
from fathom.controller.bootstrap import OVSDB_PORT
from fathom.controller.fabric import FabricRuntime
from fathom.controller.setups import SETUP_WAIT
from fathom.lab.ovs import wait_for

from .test_spec_ovs import Ovs


class Rec:
    """What the fabric runtime uses of its reconciler here: the last pass's switch results, and the
    wake-ups it asks for."""

    def __init__(self):
        self.woken: list[tuple[str, str]] = []
        self.last = SimpleNamespace(switches={})

    def ovsdb_changed(self, name: str, what: str) -> None:
        self.woken.append((name, what))


def _loopback() -> str:
    return f"127.{random.randint(64, 250)}.{random.randint(1, 250)}.{random.randint(1, 250)}"


@pytest.fixture
def runtime():
    channels.use_plain_tcp()
    rt = FabricRuntime(None, None, 6653, lambda: None)
    yield rt
    rt.stop()


def test_a_tor_that_never_answers_holds_no_pass(runtime):
    ip = _loopback()
    rec, tor = Rec(), SimpleNamespace(name="tor1", management_ip=ip)
    with socket.create_server((ip, OVSDB_PORT), backlog=8):     # takes connections, never answers
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match="not answered yet"):
            runtime._connect(rec, tor)
        assert time.monotonic() - t0 < SETUP_WAIT + 1
        assert rec.woken == []
        # the attempt ends at its own timeout and wakes a pass, which takes its failure
        wait_for(lambda: rec.woken, 15, "the failed connection's wake-up")
        assert rec.woken[0] == ("tor1", "setup")
        with pytest.raises(TimeoutError, match="did not send its schema"):
            runtime._connect(rec, tor)
        # the fabric switch is in error now: the passes that try again do not wait for it at all
        key = SwitchKey(FABRIC_SWITCH, "tor1")
        rec.last.switches[key] = SimpleNamespace(setup="error")
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match="not answered yet"):
            runtime._connect(rec, tor)
        assert time.monotonic() - t0 < SETUP_WAIT / 2


def test_a_tor_that_answers_is_connected_within_the_pass(runtime, tmp_path):
    ip = _loopback()
    ovs = Ovs(tmp_path).start()
    try:
        ovs.run("ovs-appctl", "-t", f"{tmp_path}/ovsdb-server.{ovs.procs[0].pid}.ctl",
                "ovsdb-server/add-remote", f"ptcp:{OVSDB_PORT}:{ip}")
        ovs.vsctl("add-br", "tor", "--", "set", "bridge", "tor", "datapath_type=dummy")
        rec, tor = Rec(), SimpleNamespace(name="tor1", management_ip=ip)
        try:
            ovsdb = runtime._connect(rec, tor)
        except ConnectionError:    # slower than SETUP_WAIT (a crowded machine): the pass it wakes takes it
            wait_for(lambda: rec.woken, 15, "the connection's wake-up")
            ovsdb = runtime._connect(rec, tor)
        try:
            assert ovsdb.ready() and "tor" in ovsdb.ofports("tor")
            assert runtime._connecting == {}
        finally:
            ovsdb.close()
    finally:
        ovs.stop()
