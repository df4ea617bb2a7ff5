"""OpenFlow roles against a real ovs-vswitchd: the lease epoch as generation_id fences a replica that
lost mastership. Two replicas (fathom's os-ken app, one process each: role_replica.py) and one OVS
instance in a namespace of their own (loopback only), its two bridges (OpenFlow 1.4, and 1.3 where
OVS reports a demotion with the ONF role-status extension) connected to both replicas.

A is master under epoch 5; B becomes master under 6: the switch demotes A (A hears a role status),
refuses A's flow with OFPBRC_IS_SLAVE and A's master request under 5 with OFPRRFC_STALE; the flow
table holds B's flow only. A's slave request then succeeds (it carries the switch's generation_id)."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from fathom.lab.ovs import OvsInstance
from fathom.lab.sh import run

from .util import ovs_in_namespace

pytestmark = pytest.mark.lab   # tests/lab needs root: conftest stops the run without it

NAME = "clroles"
RUNDIR = Path("/run/fathom") / NAME
BRIDGES = {"clroles14": (0xc100000000000014, "OpenFlow14"), "clroles13": (0xc100000000000013, "OpenFlow13")}
PORTS = {"a": 46671, "b": 46672}
REPLICA = Path(__file__).with_name("role_replica.py")


class Replica:
    def __init__(self, port: int, env: dict):
        dpids = [f"{d:016x}" for d, _ in BRIDGES.values()]
        self.proc = subprocess.Popen(["ip", "netns", "exec", NAME, sys.executable, str(REPLICA), str(port), *dpids],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def _answer(self) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        assert ready, "the replica did not answer within 60 s"
        line = self.proc.stdout.readline()
        assert line, "the replica process ended"
        return json.loads(line)

    def ready(self) -> bool:
        return self._answer()["ready"]

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def end(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def ovs():
    with ovs_in_namespace(NAME, RUNDIR) as inst:
        for bridge, (dpid, protocol) in BRIDGES.items():
            inst.vsctl("add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev", "fail_mode=secure",
                       "other-config:disable-in-band=true",
                       f"protocols={protocol}", f"other-config:datapath-id={dpid:016x}")
            inst.vsctl("set-controller", bridge, *(f"tcp:127.0.0.1:{p}" for p in PORTS.values()))
        yield inst


def _cookies(ovs: OvsInstance, bridge: str, protocol: str) -> set[int]:
    out = run(["ovs-ofctl", "-O", protocol, "dump-flows", bridge], ns=NAME, env=ovs.env).stdout
    return {int(w.split("=")[1].rstrip(","), 16) for line in out.splitlines() for w in line.split() if w.startswith("cookie=")}


def test_a_newer_epoch_fences_the_old_master(ovs):
    env = {**os.environ, **ovs.env}
    a, b = Replica(PORTS["a"], env), Replica(PORTS["b"], env)
    try:
        assert a.ready() and b.ready()
        for bridge, (dpid, protocol) in BRIDGES.items():
            sw = f"{dpid:016x}"
            assert a.ask(role=sw, epoch=5) == {"generation": 5}
            assert b.ask(role=sw, epoch=6) == {"generation": 6}
            refused = a.ask(flow=sw, cookie=0xa1)
            assert "OFPBRC_IS_SLAVE" in refused.get("not_master", ""), (bridge, refused)
            stale = a.ask(role=sw, epoch=5)
            assert "OFPRRFC_STALE" in stale.get("not_master", ""), (bridge, stale)
            assert b.ask(flow=sw, cookie=0xb1) == {"ok": True}
            assert _cookies(ovs, bridge, protocol) == {0xb1}, bridge
            # the demotion (role status) and the refused write both reached A's app
            assert a.ask(told=True)["not_master_events"].get(sw, 0) >= 2, bridge
            assert b.ask(told=True)["not_master_events"].get(sw, 0) == 0, bridge
            # a slave request needs no epoch: it carries the switch's; A stays refused
            assert a.ask(role=sw, epoch=None) == {"generation": 6}
            assert "not_master" in a.ask(flow=sw, cookie=0xa2)
            assert _cookies(ovs, bridge, protocol) == {0xb1}, bridge
    finally:
        a.end()
        b.end()
