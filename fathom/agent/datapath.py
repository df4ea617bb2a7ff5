"""Flushing the node's datapath when the controller asks (fathom.model.hostlocal.DatapathFlush).

After a router moved between modes, OVS's userspace datapath (`netdev`) can go on forwarding an
established flow by the path its switch no longer holds: its revalidators saw the flow table
change, yet some cached flows keep their old actions (docs/fabric.md, Router modes). The
controller asks each node whose path changed, once the switches hold the new flows; the agent
then drops every cached flow (`ovs-appctl revalidator/purge`), and the next packets are switched
by the tables as they are. A kernel datapath (`system`) is left alone: the stale flows were
seen on the userspace datapath, and the lab has no OVS kernel module to try the other.

Each request is carried out once (its `generation`, numbered from the controller's clock, so a
restarted controller's are new); a restarted agent carries out the one it finds, as it cannot
tell whether it did. A purge drops every tenant's cached flows on the node, and any tenant can
move its routers: purges on one node are at least MIN_INTERVAL apart (a request that comes
sooner waits out the rest; requests that come while it waits are one purge), so a tenant moving
routers in a loop costs the node's other tenants one purge a second at most.
"""
from __future__ import annotations

import logging
import time

from fathom.agent.local import LocalOvs
from fathom.model.hostlocal import DatapathFlush, digest, owner_key

LOG = logging.getLogger("fathom.agent.datapath")
USERSPACE = "netdev"
MIN_INTERVAL = 1.0      # seconds between two purges on one node


class DatapathFlushes:
    KIND = DatapathFlush.KIND

    def __init__(self, ovs: LocalOvs, bridge: str = "br-int", min_interval: float = MIN_INTERVAL):
        self.ovs = ovs
        self.bridge = bridge
        self.min_interval = min_interval
        self.done: int | None = None      # the generation last carried out
        self.purged_at: float | None = None   # time.monotonic() of the last purge

    def apply(self, objects: list[DatapathFlush]) -> dict[str, dict]:
        out = {}
        for obj in objects:
            try:
                if obj.generation != self.done:
                    self.flush(obj)
                    self.done = obj.generation
                out[owner_key(obj.owner)] = {"status": "active", "reason": None, "applied": digest([obj])}
            except Exception as e:  # noqa: BLE001 - the request's status; tried again on the next apply
                LOG.warning("datapath flush %d: %s", obj.generation, e)
                out[owner_key(obj.owner)] = {"status": "error", "reason": f"datapath flush: {str(e)[:900]}",
                                             "applied": digest([obj])}
        return out

    def flush(self, obj: DatapathFlush) -> None:
        routers = ", ".join(map(str, obj.routers))
        datapath = self.ovs.vsctl("get", "Bridge", self.bridge, "datapath_type").strip('"') or "system"
        if datapath != USERSPACE:
            LOG.info("datapath flush %d (routers %s moved): %s datapath, nothing to do", obj.generation, routers,
                     datapath)
            return
        waited = 0.0
        if self.purged_at is not None:
            waited = max(0.0, self.purged_at + self.min_interval - time.monotonic())
            time.sleep(waited)
        self.ovs.appctl("revalidator/purge")
        self.purged_at = time.monotonic()
        LOG.info("datapath flush %d (routers %s moved): cached flows dropped%s", obj.generation, routers,
                 f" (after waiting {waited:.2f} s: the last purge was too recent)" if waited else "")
