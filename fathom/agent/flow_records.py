"""The agent's flow-records collector: this node's OVS exports IPFIX to it on the node's loopback; it
reads the samples (fathom.agent.ipfix), adds them up per interval by observation point and
5-tuple, and delivers the sums to the controller (POST /v1/flow-records/ingest, packed as
fathom.model.flow_batch says, with the node's agent token). docs/flow-records.md.

- Set-up (`ensure_exporter`): br-int's `Flow_Sample_Collector_Set` id COLLECTOR_SET with an
  `IPFIX` row whose target is this collector, OVS's own flow cache on (`cache_active_timeout`,
  `cache_max_flows`), so OVS sends one record per flow and active timeout, not one per packet.
  Checked again every `setup_every` seconds (the bridge may be made again by a bootstrap).
- Bad input is counted, never kept: a datagram from anything but the loopback (`foreign`), one
  that is not well-formed IPFIX (`malformed`), of another observation domain (`other_domain`), a
  record of an observation point kind fathom does not make (`unknown_point`), a data set whose
  template is not known (`unknown_template`).
- Memory is bounded: at most `max_flows` keys per interval; a sample of a further key is
  dropped and counted (`evicted`). At most `max_pending` intervals wait for delivery; an older
  one is dropped and counted (`lost_intervals`) when the controller is unreachable.
- Rate: one POST per interval (at most `max_flows` records, in batches of BATCH); a 429 waits
  for its Retry-After.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque

from fathom.agent.ipfix import Malformed, Reader
from fathom.model import flow_batch
from fathom.model.flow_records import COLLECTOR_SET, KINDS, OBS_DOMAIN, parse_point

LOG = logging.getLogger("fathom.agent.flow_records")
PORT = 4739          # IANA's IPFIX port, on the node's loopback
BATCH = flow_batch.MAX_RECORDS       # records per POST: the controller's limit
LOOPBACK = "127.0.0.1"


def ensure_exporter(ovs, port: int, bridge: str = "br-int", active_timeout: int = 1,
                    max_flows: int = 4096) -> bool:
    """br-int's collector set COLLECTOR_SET exports to LOOPBACK:port (made or corrected); False when
    the bridge is not there yet."""
    if bridge not in ovs.vsctl("list-br", check=False).split():
        return False
    target = f'"{LOOPBACK}:{port}"'
    want = {"targets": f"[{target}]", "cache_active_timeout": str(active_timeout),
            "cache_max_flows": str(max_flows)}
    sets = ovs.vsctl("--bare", "--columns=_uuid,ipfix", "find", "Flow_Sample_Collector_Set",
                     f"id={COLLECTOR_SET}", check=False).split()
    if len(sets) == 2 and {k: ovs.vsctl("get", "IPFIX", sets[1], k, check=False) for k in want} == want:
        return True
    for uuid in sets[::2]:      # (uuid, ipfix) pairs: another target or cache, or several rows
        ovs.vsctl("--if-exists", "destroy", "Flow_Sample_Collector_Set", uuid, check=False)
    ovs.vsctl("--", "--id=@br", "get", "Bridge", bridge,
              "--", "--id=@i", "create", "IPFIX", f"targets={target}", f"cache_active_timeout={active_timeout}",
              f"cache_max_flows={max_flows}",
              "--", "create", "Flow_Sample_Collector_Set", f"id={COLLECTOR_SET}", "bridge=@br", "ipfix=@i")
    return True


class Aggregator:
    """Samples added up by (observation point, 5-tuple) over one interval, at most `max_flows` keys."""

    def __init__(self, max_flows: int = 20_000):
        self.max_flows = max_flows
        self.flows: dict[tuple, list] = {}
        self.counters = {"samples": 0, "evicted": 0, "unknown_point": 0}

    def add(self, rec: dict, now: float) -> None:
        point = rec.get("point")
        if point is None or parse_point(point)[0] not in KINDS or "src" not in rec or "dst" not in rec:
            self.counters["unknown_point"] += 1
            return
        proto = rec.get("proto", 0)
        sport = rec.get("sport", rec.get("icmp_type", 0))
        dport = rec.get("dport", rec.get("icmp_code", 0))
        key = (point, rec["src"], rec["dst"], proto, sport, dport)
        flow = self.flows.get(key)
        if flow is None:
            if len(self.flows) >= self.max_flows:
                self.counters["evicted"] += 1
                return
            flow = self.flows[key] = [0, 0, now, now]
        flow[0] += rec.get("packets", 1)
        flow[1] += rec.get("bytes", 0)
        flow[3] = now
        self.counters["samples"] += 1

    def take(self) -> list[dict]:
        """The interval's records, and a new interval begins."""
        flows, self.flows = self.flows, {}
        return [{"point": k[0], "src": k[1], "dst": k[2], "proto": k[3], "sport": k[4], "dport": k[5],
                 "packets": v[0], "bytes": v[1], "first": round(v[2], 3), "last": round(v[3], 3)}
                for k, v in flows.items()]


class FlowRecords:
    """The collector: `run(stopping)` reads, adds up and delivers until `stopping` is set."""

    def __init__(self, http, ovs=None, port: int = PORT, interval: float = 5.0,
                 max_flows: int = 20_000, max_pending: int = 12, setup_every: float = 10.0):
        self.http, self.ovs = http, ovs  # the node is the agent token's
        self.interval, self.max_pending, self.setup_every = interval, max_pending, setup_every
        self.reader = Reader()
        self.agg = Aggregator(max_flows)
        self.pending: deque[tuple[float, list[dict]]] = deque()
        self.counters = {"messages": 0, "malformed": 0, "foreign": 0, "other_domain": 0, "unknown_template": 0,
                         "delivered": 0, "refused": 0, "lost_intervals": 0, "post_failures": 0}
        self.last_error: str | None = None
        self.exporting = False
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((LOOPBACK, port))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._retry_at = 0.0

    def status(self) -> dict:
        return {"port": self.port, "exporting": self.exporting, "flows": len(self.agg.flows),
                "pending_intervals": len(self.pending), **self.counters, **self.agg.counters,
                "last_error": self.last_error}

    def receive(self, data: bytes, source: str, now: float) -> None:
        """One datagram: checked, read, its samples added up (bad ones counted)."""
        self.counters["messages"] += 1
        if source != LOOPBACK:
            self.counters["foreign"] += 1
            return
        try:
            msg = self.reader.read(data)
        except Malformed as e:
            self.counters["malformed"] += 1
            self.last_error = f"malformed IPFIX: {e}"
            return
        if msg.domain != OBS_DOMAIN:
            self.counters["other_domain"] += 1
            return
        self.counters["unknown_template"] += msg.unknown_sets
        for rec in msg.records:
            if "point" in rec:
                self.agg.add(rec, now)

    def close_interval(self, now: float) -> None:
        records = self.agg.take()
        if records:
            self.pending.append((now, records))
            while len(self.pending) > self.max_pending:
                self.pending.popleft()
                self.counters["lost_intervals"] += 1

    def deliver(self, now: float) -> None:
        """POST the waiting intervals, oldest first, until one fails."""
        while self.pending and now >= self._retry_at:
            end, records = self.pending[0]
            while records:
                body = flow_batch.encode(records[:BATCH], end, self.interval)
                try:
                    r = self.http.post("/v1/flow-records/ingest", content=body,
                                       headers={"Content-Type": flow_batch.CONTENT_TYPE})
                except OSError as e:
                    self._failed(now, f"{type(e).__name__}: {e}", 2.0)
                    return
                if r.status_code == 429:
                    self._failed(now, "controller: too many records, retrying later", _retry_after(r))
                    return
                if r.status_code == 200:
                    out = r.json()
                    self.counters["delivered"] += out.get("accepted", 0)
                    self.counters["refused"] += out.get("refused", 0)
                elif 400 <= r.status_code < 500:      # can never pass: dropped, counted
                    self.counters["refused"] += len(records[:BATCH])
                    self.last_error = f"controller refused a batch: HTTP {r.status_code} {r.text[:200]}"
                else:
                    self._failed(now, f"HTTP {r.status_code}: {r.text[:200]}", 2.0)
                    return
                del records[:BATCH]
            self.pending.popleft()

    def _failed(self, now: float, why: str, wait: float) -> None:
        self.counters["post_failures"] += 1
        self.last_error = why
        self._retry_at = now + wait
        LOG.warning("flow records: %s", why)

    def run(self, stopping: threading.Event) -> None:
        next_close = time.monotonic() + self.interval
        next_setup = 0.0
        try:
            while not stopping.is_set():
                now = time.monotonic()
                if self.ovs is not None and now >= next_setup:
                    try:
                        self.exporting = ensure_exporter(self.ovs, self.port)
                    except Exception as e:  # noqa: BLE001 - OVS not ready: tried again later
                        self.exporting, self.last_error = False, f"IPFIX set-up: {e}"
                    # until br-int is there (the controller's bootstrap makes it): soon again
                    next_setup = now + (self.setup_every if self.exporting else 1.0)
                try:
                    data, (source, _) = self.sock.recvfrom(65535)
                    self.receive(data, source, time.time())
                except socket.timeout:
                    pass
                now = time.monotonic()
                if now >= next_close:
                    next_close = now + self.interval
                    self.close_interval(time.time())
                    self.deliver(now)
                elif self.pending:
                    self.deliver(now)
        finally:
            self.sock.close()


def _retry_after(r) -> float:
    try:
        return max(1.0, float(r.headers.get("Retry-After", 5)))   # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return 5.0
