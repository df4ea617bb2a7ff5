"""Trace requests the controller hands the agent with its desired state (fathom.api.agent_traces):
`ovs-appctl ofproto/trace` of one packet on one of this node's bridges, through the tables the
bridge holds now. The output goes back as OVS printed it; the controller reads it
(fathom.trace.ofproto).

The agent checks every request itself (a bridge fathom programs, a flow of plain field=value
pairs, known conntrack states) and runs the command with an argument list, no shell. A trace
without a packet changes nothing on the switch: no learn, no controller or sample action runs.
"""
from __future__ import annotations

import logging
import re

from fathom.agent.livetrace import LiveTraces
from fathom.agent.local import LocalOvs
from fathom.host.exec import CommandError

LOG = logging.getLogger("fathom.agent.trace")
# as the controller bounds them (fathom.api.agent_traces; repeated here: the agent loads no API code)
BRIDGES = ("br-int", "br-phy")
CT_NEXT = ("trk,new", "trk,est")
FLOW_RE = re.compile(r"^[a-z][a-z0-9_]*(=[0-9A-Za-z_.:/x]+)?(,[a-z][a-z0-9_]*(=[0-9A-Za-z_.:/x]+)?)*$")
MAX_FLOW, MAX_CT_NEXT, MAX_OUTPUT = 1024, 8, 256 * 1024


class Tracer:
    def __init__(self, ovs: LocalOvs):
        self.ovs = ovs
        self.live = LiveTraces(ovs)

    def run(self, ask: dict) -> dict:
        """The answer to one request: {"output": what OVS printed} or {"error": why not}; a live
        trace's request (fathom.agent.livetrace): {"live": ...} or {"error": why not}."""
        if ask.get("kind", "ofproto") != "ofproto":
            return self.live.run(ask)
        bridge, flow, ct_next = ask.get("bridge"), ask.get("flow"), ask.get("ct_next") or []
        if bridge not in BRIDGES or not isinstance(flow, str) or len(flow) > MAX_FLOW or not FLOW_RE.match(flow) \
                or not isinstance(ct_next, list) or len(ct_next) > MAX_CT_NEXT or any(c not in CT_NEXT for c in ct_next):
            return {"error": "not a trace request this agent runs (bridge, flow or ct_next out of bounds)"}
        args = [a for c in ct_next for a in ("--ct-next", c)]
        try:
            out = self.ovs.appctl("ofproto/trace", *args, bridge, flow)
        except CommandError as e:
            return {"error": f"ovs-appctl ofproto/trace: {str(e)[:1500]}"}
        return {"output": out[:MAX_OUTPUT]}
