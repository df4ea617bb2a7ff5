"""What the nodes' agents hold, in the pass's statuses: a reconciler extension that never touches
a host.

After every pass it reads, from the store, every node's host-local desired state (the pure
fathom.model.hostlocal_desired of the same model) and what each agent last reported, and puts the status of
every object an agent must hold into the pass result (fathom.controller.status.hostlocal decides
it). The agents themselves follow `GET /v1/agents/<node>/desired` and do the work on their hosts:
the controller process runs no command on a node and enters no namespace.

Port chains measured with PPTMon get a warning in their status reason when their sinks see too
few of the packets their sources stamped (fathom.model.chains.lost_across, from the
counters the agents report); `check` looks again between passes, as the counters move with no event.

A network-node router whose namespace the agent reports built is still `pending` until the pass
has seen its legs (`qrp<N>`) on the gateway node's br-int over OVSDB, when the switches start
routing through it (fathom.model.routers.effective_modes).

A router moved between modes, joining or leaving a network, or removed asks every node whose
path for its traffic changed to drop the flows its datapath cached (fathom.model.hostlocal.
DatapathFlush, numbered per node and handed to the agent hub by `ask_flush`, as the agents'
desired state); the router stays `pending` until those nodes' agents say they did. The request is
made here, after the pass's switches acknowledged the new flows, never before: a datapath flushed
earlier would cache the old path again.

DHCP servers get a status per node (`result.dhcp_servers`, shown on their subnets as
`dhcp_status`), never folded into their network's: the network's status is the switches' word.
"""
from __future__ import annotations

import logging
import time

from fathom.model.hostlocal_desired import Desired
from fathom.model.chains import WARNING_KIND, chain_warnings
from fathom.model.hostlocal import DatapathFlush, Digests
from fathom.controller import status
from fathom.controller.extension import Extension
from fathom.model.routers import effective_modes, router_paths
from fathom.store import agents as ag
from fathom.store.changes import ALL
from fathom.store.db import READ_ONLY

LOG = logging.getLogger("fathom.hostlocal")
# The tables the agents' reports and the PPTMon attachments are read from
TABLES = frozenset({"node_agents", "pptmon_attachments", "nodes"})


class HostLocalStatus(Extension):
    """`presence(node)`: when this process last heard the node's agent (its long-poll, held or
    renewed: fathom.api.agents.AgentHub.last_heard), None if it did not; the store's last report
    counts too."""

    def __init__(self, session_factory, stale_after: float = ag.STALE_AFTER, presence=lambda node: None,
                 ask_flush=lambda flushes: None):
        self.Session = session_factory
        self.ask_flush = ask_flush       # ({node: DatapathFlush}) -> None: what the agents are asked now
        self.stale_after = stale_after
        self.presence = presence
        self.down: set[str] = set()     # nodes whose agent was down at the last pass (for the log)
        self.views: dict[str, ag.AgentView] = {}   # the agents as the last pass read them
        self.snapshot = None             # of the last pass, and the PPTMon warnings of its chains then
        self.warnings: dict[int, str] = {}
        self.attachments: list | None = None   # as the last read found them
        self._reads = None               # the reconciler's store reads at that read
        self.digests = Digests()         # of the host-local objects, kept from pass to pass
        self.desired = Desired()         # the host-local desired state, kept from pass to pass
        self.paths: dict | None = None   # router id -> RouterPath at the last pass
        self.flushes: dict[str, DatapathFlush] = {}   # node -> the last flush it was asked for
        self.flushing: dict[int, frozenset[str]] = {}  # router id -> nodes whose flush it waits for

    def prepare(self, rec, snapshot, result):
        return snapshot

    def _agents(self, views: dict[str, ag.AgentView]) -> dict[str, ag.AgentView]:
        return {n: ag.heard(v, self.presence(n)) for n, v in views.items()}

    def _down(self, agents: dict[str, ag.AgentView], now: float) -> set[str]:
        return {n for n, v in agents.items() if v.reported_at is not None and now - v.reported_at > self.stale_after}

    def check(self, rec) -> bool:
        """For the reconciler's periodic check (passes run on events only): whether an agent
        went silent or came back since the last pass, or (only while a chain is measured) a chain's
        PPTMon warning changed. Otherwise in memory only (what the last pass read, and the agents'
        presence): a report that says something new wakes a pass itself; counters do not."""
        if self.snapshot is not None and any(c.pptmon is not None for c in self.snapshot.port_chains):
            with self.Session() as session, session.begin():
                session.connection(execution_options=READ_ONLY)
                self.views = ag.agents(session)
            if chain_warnings(self.snapshot, self._agents(self.views)) != self.warnings:
                return True
        return self._down(self._agents(self.views), time.time()) != self.down

    def _flush_moved_routers(self, snapshot) -> None:
        """Ask the nodes whose path changed to flush their datapaths: those of a router the switches
        now route otherwise (another mode or gateway node, a network joined or left) or that is
        gone (the nodes it used before and uses now), but for nodes known to run the kernel
        datapath. The first pass only learns the paths."""
        paths = router_paths(snapshot)
        kernel = {n.name for n in snapshot.nodes if n.datapath_type == "system"}   # not affected
        moved: dict[str, list[int]] = {}
        if self.paths is not None:
            for rid, before in self.paths.items():
                now = paths.get(rid)
                if not before.rerouted(now):
                    continue
                every = (before.nodes | (now.nodes if now is not None else frozenset())) - kernel
                for node in every:
                    moved.setdefault(node, []).append(rid)
                if now is not None and every:
                    self.flushing[rid] = every
                else:
                    self.flushing.pop(rid, None)
        self.paths = paths
        if moved:
            for node, rids in moved.items():
                # numbered from the clock's seconds on, so that a restarted controller's requests
                # are new to an agent that carried out the last one's
                last = self.flushes.get(node)
                generation = max(last.generation + 1 if last else 0, int(time.time()))
                self.flushes[node] = DatapathFlush(generation, tuple(sorted(rids)))
            LOG.info("asking %s to flush their datapaths (routers %s moved)", ", ".join(sorted(moved)),
                     ", ".join(map(str, sorted({r for rids in moved.values() for r in rids}))))
            self.ask_flush(dict(self.flushes))

    def _flush_statuses(self, agents: dict, now: float) -> dict[int, status.Status]:
        """router id -> `pending` (or `error`: an agent down) while a node it moved on has not
        flushed; a router whose nodes all did is no longer waited for."""
        out = {}
        for rid, nodes in list(self.flushing.items()):
            waiting = {n: status.held(n, agents.get(n), self.flushes[n], now, self.stale_after, self.digests)
                       for n in sorted(nodes) if n in self.flushes}
            bad = [(level, f"flushing the datapath on node {n} after the move: {why}")
                   for n, (level, why) in waiting.items() if level != "active"]
            if bad:
                out[rid] = status.worst(bad)
            else:
                del self.flushing[rid]
        return out

    def _stale(self, rec) -> bool:
        """Whether the agents' reports and the attachments must be read again: the reconciler's
        store reads since the last one covered their tables, or read the whole store (as the
        model: writes of this process, and another's as the change feed tells them, by table).
        Reports that say something new wake a pass that reads their table; a heartbeat is seen
        with the next read, or at once when its agent looks down without it."""
        reads, written = getattr(rec, "store_reads", None), getattr(rec, "store_written", None)
        if (self.attachments is None or reads is None or self._reads is None
                or self._down(self._agents(self.views), time.time())):
            return True
        if reads == self._reads:
            return False
        return reads != self._reads + 1 or written is None or ALL in written or bool(TABLES & written)

    def after_pass(self, rec, snapshot, result) -> None:
        stale, self._reads = self._stale(rec), getattr(rec, "store_reads", None)
        if stale:
            with self.Session() as session, session.begin():
                session.connection(execution_options=READ_ONLY)
                self.attachments = ag.attachments(session)
                self.views = ag.agents(session)
        attachments = self.attachments
        agents = self._agents(self.views)
        desired = self.desired(snapshot, attachments, result.views)
        now = time.time()
        statuses = status.hostlocal(desired, agents, now, self.stale_after, self.digests)
        result.dhcp_servers = status.dhcp_servers(desired, agents, now, self.stale_after, self.digests)
        self.digests.next_round()
        effective = effective_modes(snapshot)
        for (kind, obj_id), st in statuses.items():
            if kind == "router" and st[0] == "active" and obj_id not in effective:
                st = ("pending", "waiting for the router's interfaces on the gateway node's br-int")
            result.agents[(kind, obj_id)] = st
        self._flush_moved_routers(snapshot)
        for rid, st in self._flush_statuses(agents, now).items():
            result.agents[("router", rid)] = status.worst([result.agents.get(("router", rid), ("active", None)), st])
        self.snapshot, self.warnings = snapshot, chain_warnings(snapshot, agents)
        for chain_id, warning in self.warnings.items():
            result.agents[(WARNING_KIND, chain_id)] = ("active", warning)
        down = self._down(agents, now)
        for node in sorted(down - self.down):
            LOG.warning("agent on node %s stopped reporting", node)
        for node in sorted(self.down - down):
            LOG.info("agent on node %s is back", node)
        self.down = down
