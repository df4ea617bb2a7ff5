"""What a reconcile pass found and did: per node, per switch and as a whole (`PassResult`), read
by the status decision (fathom.controller.status), the extensions and the API's views."""
from __future__ import annotations

from dataclasses import dataclass, field

from fathom.apps import BR_INT, SwitchKey
from fathom.openflow.spec import SwitchState


@dataclass
class SwitchResult:
    """A switch as the pass left it (its bootstrap, and what was sent to it)."""
    key: SwitchKey
    dpid: int
    setup: str = "ok"               # the switch's bootstrap (OVSDB): ok | error | checking (not read yet)
    reason: str | None = None       # why setup failed
    state: str = "not connected"    # ok | not connected | not reconciled (...) | lost: ... | error: ... | not answering: ...
    changes: int = 0
    last_ok: float | None = None
    apply_seconds: float = 0.0      # time spent sending this pass's change (both halves)


@dataclass
class NodeResult:
    """A node as its br-int saw the pass (the /sync answer and the node's status)."""
    bootstrap: str = "init"
    reason: str | None = None
    switch: str = "not connected"   # ok | not connected | lost: ... | error: ...
    changes: int = 0
    last_ok: float | None = None
    apply_seconds: float = 0.0


@dataclass
class PassResult:
    """Everything one pass found and did: what the statuses are decided from."""
    nodes: dict[str, NodeResult] = field(default_factory=dict)
    switches: dict[SwitchKey, SwitchResult] = field(default_factory=dict)
    desired: dict[SwitchKey, SwitchState] = field(default_factory=dict)
    # (kind, object id) -> reason: objects whose flows, groups or meters a switch refused
    refused: dict[tuple[int, int], str] = field(default_factory=dict)
    # (kind, object id) -> (status, reason) decided by an agent outside the switches (router namespaces)
    agents: dict[tuple[int, int], tuple[str, str | None]] = field(default_factory=dict)
    # network id -> ((node, status, reason), ...): its DHCP server on each node that must run one
    dhcp_servers: dict[int, tuple] = field(default_factory=dict)
    # (kind, object id) -> switches that must hold its flows (None: the status model reads `desired`)
    needs: dict | None = None
    # the (kind, object id) whose switches in `needs` changed since statuses were last decided
    # (None: not known; every object's status is decided again)
    needs_changed: set | None = None
    # monotonic time by which the datapaths have gone over what this pass made (its last commit
    # reply plus the switches' settle time; None: it made nothing), and the switches that made it
    # (datapath ids): see StatusWriter.write
    settled_at: float | None = None
    made_on: tuple = ()
    # the views of the model the pass compiled (fathom.model.views): the apps' status reads them too
    views: object = None

    def br_int(self, node: str) -> SwitchState | None:
        return self.desired.get(SwitchKey(BR_INT, node))

