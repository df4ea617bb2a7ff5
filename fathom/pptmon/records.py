"""The PPTMon record as it travels from a sink's loader to the controller.

One schema for both ends: the agent validates each line before it sends it (a record the
controller would refuse is counted and skipped at the node, not retried forever) and the
controller validates the batch again (field-level 422s). The fields are the loader's JSON line
(docs/pptmon.md, Records); unknown fields are ignored so a newer loader can add some.

`record_key` is the identity used for idempotent ingestion: the sink's namespace, its VNF id, the
sink's monotonic clock in ns at report time and the sample sequence number, within a chain. A
retried batch (or a record read twice after an agent restart) has the same key; two different
records cannot (the monotonic clock of one sink never repeats a nanosecond).
"""
from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fathom.pptmon import MAX_BATCH  # noqa: F401 - the ingestion limit, used below and by importers

MAX_HOPS = 8
MAX_PPT_US = (1 << 24) - 1
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"


class Hop(BaseModel):
    model_config = ConfigDict(extra="ignore")
    vnf: int = Field(ge=0, le=255, description="VNF id (1 byte on the wire)")
    ppt_us: int | None = Field(default=None, ge=0, le=MAX_PPT_US,
                               description="processing time in µs; null = unknown (egress never ran)")


class Flow(BaseModel):
    model_config = ConfigDict(extra="ignore")
    family: Literal[4, 6]
    proto: Literal["tcp", "udp"]
    src: str = Field(max_length=64)
    dst: str = Field(max_length=64)
    sport: int = Field(ge=0, le=65535)
    dport: int = Field(ge=0, le=65535)
    ip_id: int | None = Field(default=None, ge=0, le=65535)
    tcp_seq: int | None = Field(default=None, ge=0, le=(1 << 32) - 1)
    l4_len: int | None = Field(default=None, ge=0, le=65535)


class PptRecord(BaseModel):
    """One sampled packet, reported by the chain's sink with every hop."""
    model_config = ConfigDict(extra="ignore")
    type: Literal["ppt"] = "ppt"
    v: Literal[1] = 1
    chain: str = Field(min_length=1, max_length=64, pattern=NAME)
    vnf_ns: str = Field(min_length=1, max_length=64, pattern=NAME, description="the sink's namespace")
    placement: Literal["guest", "host"] = "guest"
    ktime_ns: int = Field(ge=0, lt=1 << 63, description="sink's CLOCK_MONOTONIC at report time")
    time_ns: int = Field(gt=0, lt=1 << 63, description="sink's wall clock (ns since the epoch)")
    ifindex: int | None = Field(default=None, ge=0)
    sink_vnf: int = Field(ge=0, le=255)
    seq: int = Field(ge=0, le=65535, description="the source's sample sequence number")
    flags: int = Field(default=0, ge=0, le=255)
    skipped: int = Field(default=0, ge=0, le=255,
                         description="VNFs on the path that could not add their entry (option "
                                     "room, hop cap, MTU), the sink included")
    sink_measured: bool = Field(default=True, description="the sink's own time is among the hops")
    restored: bool = Field(default=True, description="the sink removed the option")
    flow: Flow
    hops: list[Hop] = Field(min_length=1, max_length=MAX_HOPS)
    e2e_us: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _consistent(self):
        times = [h.ppt_us for h in self.hops]
        if self.e2e_us is not None:
            if self.skipped or not self.sink_measured:
                raise ValueError("e2e_us must be null when a VNF of the chain has no entry")
            if None in times:
                raise ValueError("e2e_us must be null when a hop's time is unknown")
            if self.e2e_us != sum(times):
                raise ValueError(f"e2e_us {self.e2e_us} is not the sum of the hops ({sum(times)})")
        return self

    @property
    def key(self) -> str:
        return record_key(self.chain, self.vnf_ns, self.sink_vnf, self.ktime_ns, self.seq)


class RecordBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: str = Field(default="", max_length=64, description="the agent's node (informational)")
    records: list[PptRecord] = Field(max_length=MAX_BATCH)


def record_key(chain: str, vnf_ns: str, sink_vnf: int, ktime_ns: int, seq: int) -> str:
    raw = f"{chain}\0{vnf_ns}\0{sink_vnf}\0{ktime_ns}\0{seq}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
          "d": 86400.0}


def parse_duration(text: str) -> float:
    """'90s', '5m', '2h', '7d', '250ms', '0' -> seconds (a bare number is seconds)."""
    import re
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(ns|us|µs|ms|s|m|h|d)?\s*", text or "")
    if not m:
        raise ValueError(f"bad duration {text!r} (e.g. 30s, 5m, 2h, 7d)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]
