"""A role request to a switch that stopped answering without closing its connection (no TCP reset)
fails after fathom.controller.switch.ROLE_REPLY_TIMEOUT instead of holding the replica's role thread
until the keepalive drops the connection; so do the reads made for an API caller (a node's flows, a
port's counters) after STATS_REPLY_TIMEOUT. The replica is fathom's os-ken app in a process of its
own (tests/lab/role_replica.py: os-ken's app manager is one per process); the switch is the
benchmarks' simulated switch, silent once connected."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from fathom.bench.ofswitch import OFSwitch
from fathom.controller.switch import ROLE_REPLY_TIMEOUT

REPLICA = Path(__file__).parents[1] / "lab" / "role_replica.py"


class SilentSwitch(OFSwitch):
    """Answers until `silent`, then reads and answers nothing (its host gone, the socket still open)."""
    silent = False

    def handle(self, channel, msg_type, xid, msg):
        if not self.silent:
            super().handle(channel, msg_type, xid, msg)


def test_a_role_request_or_a_read_of_a_silent_switch_fails_within_the_time_limit():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dpid = 0x5C
    replica = subprocess.Popen([sys.executable, str(REPLICA), str(port), f"{dpid:016x}"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    switch = SilentSwitch(dpid)
    try:
        time.sleep(0.5)              # the replica listens (the switch tries again every RECONNECT_S otherwise)
        switch.set_targets([("127.0.0.1", port)])
        assert json.loads(replica.stdout.readline()) == {"ready": True}

        def ask(cmd):
            replica.stdin.write(json.dumps(cmd) + "\n")
            replica.stdin.flush()
            return json.loads(replica.stdout.readline())

        def role(epoch):
            return ask({"role": f"{dpid:016x}", "epoch": epoch})
        assert role(1) == {"generation": 1}             # answered while it answers
        assert ask({"read": f"{dpid:016x}", "timeout": 2.0})["flows"] is not None
        switch.silent = True
        t = time.monotonic()
        answer = role(2)
        took = time.monotonic() - t
        assert "no reply to the role request within" in answer.get("error", ""), answer
        assert ROLE_REPLY_TIMEOUT <= took < ROLE_REPLY_TIMEOUT + 2, took

        t = time.monotonic()
        answer = ask({"read": f"{dpid:016x}", "timeout": 0.5})
        took = time.monotonic() - t
        assert answer == {"flows": None, "counters": "TimeoutError"}, answer    # not connected / did not answer
        assert 1.0 <= took < 1.0 + 2, took
    finally:
        switch.set_targets([])
        replica.kill()
        replica.wait()
