"""A bundle against a real ovs-vswitchd (OpenFlow 1.4): the commit reply is the acknowledgement a
port's `active` rests on, so it must come only for a bundle the switch took whole; a refused message
is named by its spec and nothing of its bundle is installed; a connection that closes ends the wait.

os-ken runs in a child process (its app manager is one per process), in a namespace of its own with
one OVS instance (namespace, run dir and bridge `ofbndl`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fathom.host import exec as host_exec

from .util import ovs_in_namespace

pytestmark = pytest.mark.lab   # tests/lab needs root: conftest stops the run without it

NAME = "ofbndl"
RUNDIR = Path("/run/fathom") / NAME
DPID = 0xfb00000000000001
PORT = 46653

SCRIPT = r"""
import json, os, sys, time
from fathom.controller import ofapp, ofgate
from fathom.controller.switch import COMMIT_TIMES, ApplyError, OsKenSession
from fathom.openflow.encode import Wire
from fathom.openflow.spec import FlowSpec, Group, Output

DPID, PORT, DB = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
app = ofapp.start("127.0.0.1", PORT, ofgate.Gate(False, lambda identity: {DPID}))
deadline = time.monotonic() + 20
while app.datapath(DPID) is None and time.monotonic() < deadline:
    time.sleep(0.05)
dp = app.datapath(DPID)
session = OsKenSession(app, dp)
good = FlowSpec(table=0, priority=10, match={"in_port": 1}, actions=(Output(2),), cookie=0x11)
bad = FlowSpec(table=0, priority=20, match={"in_port": 2}, actions=(Group(99),), cookie=0x22)  # no group 99
out = {}
try:
    session.bundle([(good, Wire(dp, "flow", good)), (bad, Wire(dp, "flow", bad))])
    out["refused"] = None
except ApplyError as e:
    out["refused"] = [s.cookie for s in e.refused]
    out["refusal"] = str(e)
out["after_refusal"] = sorted(f.cookie for f in session.read_flows())
session.bundle([(good, Wire(dp, "flow", good))])
out["after_good"] = sorted(f.cookie for f in session.read_flows())
out["commits"] = COMMIT_TIMES.totals()
# the switch leaves: a bundle on its closed connection fails, it does not wait
import subprocess
subprocess.run(["ovs-vsctl", f"--db=unix:{DB}", "del-controller", "ofbndl"], check=True)
deadline = time.monotonic() + 10
while app.datapath(DPID) is not None and time.monotonic() < deadline:
    time.sleep(0.05)
t = time.monotonic()
try:
    session.bundle([(good, Wire(dp, "flow", good))])
    out["closed"] = "no error"
except ApplyError as e:
    out["closed"] = str(e)
out["closed_seconds"] = time.monotonic() - t
print(json.dumps(out), flush=True)
os._exit(0)   # os-ken's threads do not end
"""


@pytest.fixture
def ovs():
    with ovs_in_namespace(NAME, RUNDIR) as inst:
        inst.vsctl("add-br", NAME, "--", "set", "bridge", NAME, "datapath_type=netdev", "fail_mode=secure",
                   "protocols=OpenFlow14", f"other-config:datapath-id={DPID:016x}")
        inst.vsctl("set-controller", NAME, f"tcp:127.0.0.1:{PORT}")
        yield inst


def test_a_bundle_is_acknowledged_whole_or_refused_by_message(ovs):
    proc = subprocess.run(host_exec.argv([sys.executable, "-c", SCRIPT, str(DPID), str(PORT),
                           ovs.db_sock], NAME), capture_output=True, text=True, timeout=90, env={**os.environ, **ovs.env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # the flow using a group the switch lacks is named; its bundle left nothing behind
    assert got["refused"] == [0x22], got
    assert "refused the change" in got["refusal"], got
    assert got["after_refusal"] == [], got
    # a bundle the switch takes is in its table once the commit reply came (no barrier after it)
    assert got["after_good"] == [0x11], got
    # both bundles answered are timed (the refused one too: the switch answered it), in well under the wait
    assert got["commits"]["count"] == 2 and 0 < got["commits"]["seconds"] < 10, got
    # a closed connection fails the bundle at once
    assert got["closed"] != "no error" and got["closed_seconds"] < 5, got
