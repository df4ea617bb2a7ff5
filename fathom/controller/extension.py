"""What the reconciler asks of the collaborators it runs with: the nodes' OVSDB (`NodeBootstrap`)
and the providers of more switches and agents (`Extension`). Typed here so the reconciler calls
them without probing for what they have."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from fathom.model import Snapshot

# (state, reason, br-int OpenFlow port numbers by interface name): a node's bridge check's answer
NodeAnswer = tuple[str, str | None, dict[str, int]]


class NodeBootstrap(Protocol):
    """The nodes' OVSDB (fathom.controller.bootstrap.Bootstrapper). `run(node)` checks (and
    repairs) a node's bridges; `current(node)` answers from the OVSDB replica without a round
    trip, or None when the node must be checked with `run`; `on_change(name, what)` is set by the
    reconciler and called on a node's OVSDB change (what: "ports" or "setup")."""
    on_change: Callable[[str, str], None]

    def run(self, node) -> NodeAnswer: ...

    def current(self, node) -> NodeAnswer | None: ...


class NoBootstrap:
    """No OVSDB at all (a reconciler that serves reads only): every node's check fails."""

    def __init__(self):
        self.on_change: Callable[[str, str], None] = lambda name, what: None

    def run(self, node) -> NodeAnswer:
        return "error", "no OVSDB bootstrap configured", {}

    def current(self, node) -> NodeAnswer | None:
        return None


class Extension(Protocol):
    """A provider of more switches and agents, run by every pass (the fabric, external gateways,
    host-local status). It never writes flows. A class that names this as its base gets the no-op
    defaults of the steps it has nothing for.

    `prepare` bootstraps its switches and returns the snapshot with their runtime facts;
    `after_pass` runs its agents; `check`, at each periodic check, says whether something changed
    with no event (then a pass runs)."""

    def prepare(self, rec, snapshot: Snapshot, result) -> Snapshot:
        return snapshot

    def after_pass(self, rec, snapshot: Snapshot, result) -> None:
        return None

    def check(self, rec) -> bool:
        return False
