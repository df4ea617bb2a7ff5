"""What the nodes' agents hold, in the pass's statuses: a reconciler extension that never touches
a host.

After every pass it reads, from the store, every node's host-local desired state (the pure
fathom.apps.hostlocal of the same model) and what each agent last reported, and puts the status of
every object an agent must hold into the pass result (fathom.controller.status.hostlocal decides
it). The agents themselves follow `GET /v1/agents/<node>/desired` and do the work on their hosts:
the controller process runs no command on a node and enters no namespace.

Port chains measured with PPTMon get a warning in their status reason when their sinks see too
few of the packets their sources stamped (fathom.apps.hostlocal.chains.lost_across, from the
counters the agents report); `check` looks again between passes, as the counters move with no event.

A network-node router whose namespace the agent reports built is still `pending` until the pass
has seen its legs (`qrp<N>`) on the gateway node's br-int over OVSDB, when the switches start
routing through it (fathom.model.routers.effective_modes).
"""
from __future__ import annotations

import logging
import time

from fathom.apps.hostlocal import desired as hostlocal_desired
from fathom.apps.hostlocal.chains import WARNING_KIND, chain_warnings
from fathom.controller import status
from fathom.model.routers import effective_modes
from fathom.store import agents as ag
from fathom.store.db import READ_ONLY

LOG = logging.getLogger("fathom.hostlocal")


class HostLocalStatus:
    def __init__(self, session_factory, stale_after: float = ag.STALE_AFTER):
        self.Session = session_factory
        self.stale_after = stale_after
        self.down: set[str] = set()     # nodes whose agent was down at the last pass (for the log)
        self.snapshot = None             # of the last pass, and the PPTMon warnings of its chains then
        self.warnings: dict[int, str] = {}

    def prepare(self, rec, snapshot, result):
        return snapshot

    def check(self, rec) -> bool:
        """For the reconciler's periodic check (passes run on events only): whether an agent
        stopped or resumed reporting since the last pass, which changes statuses with no event."""
        with self.Session() as session, session.begin():
            session.connection(execution_options=READ_ONLY)
            agents = ag.agents(session)
        now = time.time()
        down = {n for n, v in agents.items() if v.reported_at is not None and now - v.reported_at > self.stale_after}
        warnings = chain_warnings(self.snapshot, agents) if self.snapshot is not None else {}
        return down != self.down or warnings != self.warnings

    def after_pass(self, rec, snapshot, result) -> None:
        with self.Session() as session, session.begin():
            session.connection(execution_options=READ_ONLY)
            attachments = ag.attachments(session)
            agents = ag.agents(session)
        desired = hostlocal_desired(snapshot, attachments)
        now = time.time()
        statuses = status.hostlocal(desired, agents, now, self.stale_after)
        effective = effective_modes(snapshot)
        for (kind, obj_id), st in statuses.items():
            if kind == "router" and st[0] == "active" and obj_id not in effective:
                st = ("pending", "waiting for the router's interfaces on the gateway node's br-int")
            result.agents[(kind, obj_id)] = st
        self.snapshot, self.warnings = snapshot, chain_warnings(snapshot, agents)
        for chain_id, warning in self.warnings.items():
            result.agents[(WARNING_KIND, chain_id)] = ("active", warning)
        down = {n for n, v in agents.items() if v.reported_at is not None and now - v.reported_at > self.stale_after}
        for node in sorted(down - self.down):
            LOG.warning("agent on node %s stopped reporting", node)
        for node in sorted(self.down - down):
            LOG.info("agent on node %s is back", node)
        self.down = down
