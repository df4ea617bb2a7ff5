"""One controller replica's OpenFlow side for the role tests: fathom's os-ken app listening on a port,
driven line by line (one JSON command on stdin, one JSON answer on stdout). os-ken's app manager is
one per process, so each replica of a test is one of these processes.

    python role_replica.py PORT DPID_HEX...

Commands: {"role": DPID_HEX, "epoch": N or null} (master under N, or slave) -> {"generation": G} or
{"not_master": why}; {"flow": DPID_HEX, "cookie": C} (one flow in a bundle) -> {"ok": true} or
{"not_master": why}; {"read": DPID_HEX, "timeout": S} (its flows and port 1's counters, each read
waiting S seconds at most) -> {"flows": count or null, "counters": "TimeoutError" or a count};
{"told": true} -> {"not_master_events": {DPID_HEX: count}} (role status or
IS_SLAVE seen by the app).
"""
import json
import os
import sys
import time
from collections import Counter

from fathom.controller import ofapp, ofgate, port_counters
from fathom.controller import switch
from fathom.controller.switch import NotMaster, OsKenSession
from fathom.openflow.encode import Wire
from fathom.openflow.spec import FlowSpec, Output


def main(argv):
    port, dpids = int(argv[0]), [int(d, 16) for d in argv[1:]]
    app = ofapp.start("127.0.0.1", port, ofgate.Gate(False, lambda identity: set(dpids)))
    told = Counter()
    app.on_not_master = lambda dpid: told.update([f"{dpid:016x}"])
    deadline = time.monotonic() + 30
    while any(app.datapath(d) is None for d in dpids) and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"ready": all(app.datapath(d) is not None for d in dpids)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if "role" in cmd:
                session = OsKenSession(app, app.datapath(int(cmd["role"], 16)))
                out = {"generation": session.request_role(cmd["epoch"])}
            elif "flow" in cmd:
                dp = app.datapath(int(cmd["flow"], 16))
                flow = FlowSpec(table=0, priority=10, match={"in_port": cmd["cookie"] & 0xff}, actions=(Output(2),),
                                cookie=cmd["cookie"])
                OsKenSession(app, dp).bundle([(flow, Wire(dp, "flow", flow))])
                out = {"ok": True}
            elif "read" in cmd:
                dp = app.datapath(int(cmd["read"], 16))
                switch.STATS_REPLY_TIMEOUT = cmd["timeout"]
                flows = switch.read_flows(app, dp)
                try:
                    counters = port_counters.read_port_stats(app, dp, 1)
                except TimeoutError as e:
                    counters = type(e).__name__
                out = {"flows": None if flows is None else len(flows), "counters": counters}
            else:
                time.sleep(0.2)     # a role status is sent with the reply to the new master's request: let it land
                out = {"not_master_events": dict(told)}
        except NotMaster as e:
            out = {"not_master": str(e)}
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)
    os._exit(0)    # os-ken's threads do not end


if __name__ == "__main__":
    main(sys.argv[1:])
