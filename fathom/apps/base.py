"""What an app is (`App`), what it reads of the model (`Reads`), how it names the switches it programs
(`SwitchKey`), the objects that own state on them (`Owner`, `OwnerOn`) and what it finds wrong with
them (`Problem`); fathom/apps/__init__.py
says how apps are run. The apps import this module, and the registry imports the apps."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, NamedTuple

from fathom.model import Snapshot
from fathom.model.views import Views
from fathom.model.status import Problem, Severity, Status  # noqa: F401 (the apps' names for them)
from fathom.openflow.spec import SwitchState

BR_INT, BR_PHY, FABRIC_SWITCH = "br-int", "br-phy", "fabric-switch"


@dataclass(frozen=True, order=True)
class SwitchKey:
    """One switch fathom programs: a node's br-int or br-phy (name = node name) or a fabric switch (its name)."""
    bridge: str
    name: str

    def __str__(self) -> str:
        return f"{self.bridge} {self.name}"


class Owner(NamedTuple):
    """An object that owns state on switches, as its cookies name it (fathom.pipeline.cookies). Named
    among the owners to compile again, it stands for its state on every switch that holds some."""
    app: int
    kind: int
    id: int

    @property
    def owner(self) -> "Owner":
        return self

    @property
    def switch(self) -> None:
        """Every switch (see OwnerOn)."""
        return None

    def on(self, switch: SwitchKey) -> "OwnerOn":
        return OwnerOn(self.app, self.kind, self.id, switch)


class OwnerOn(NamedTuple):
    """An owner's state on one switch only: compiling it again leaves its state on other switches as
    it is (e.g. a security group's address clauses on the one node the group just came to)."""
    app: int
    kind: int
    id: int
    switch: SwitchKey

    @property
    def owner(self) -> Owner:
        return Owner(self.app, self.kind, self.id)


@dataclass(frozen=True)
class PortWrite:
    """A workload port's write (created, updated, deleted) as the change feed tells it
    (fathom.store.changes.port_at): the port's id, the nodes it was and is bound to (their names,
    those it has), its network's id."""
    port: int
    nodes: frozenset[str]
    network: int


@dataclass(frozen=True)
class Reads:
    """What an app's `compile` reads of the model, and so which owners a change touches
    (fathom.apps.incremental.declared_touched). tests/unit/test_app_reads.py compiles every app
    through a view of the model that records what is read, and fails on anything not declared.

    `fields`: collection (a field of fathom.model.Snapshot, or "fabric") -> the fields of its
    objects read. A node's `ofports` are split: the port numbers of the fabric's own interfaces
    (fathom.pipeline.infrastructure) are the node's; a VIF's is its port's (a plug changes that
    port only), read as the port's `ofport`.
    `owners`: collection -> the cookie kind of the state each of its objects owns (by its id).
    `refs`: collection -> {field: the collection whose ids it holds (one id, None or a tuple)}: an
    object is touched when one it names is touched, through any chain of references.
    A change in a collection that no owner reaches through `refs` compiles the app whole.
    `quiet`: collections (or "fabric.<field>") that, empty or None in both models, mean the app
    holds nothing, whatever else changed.
    `view`: the model `compile` reads, made from the snapshot (`view(model, views)`; idempotent:
    view(view(m)) reads as view(m)), e.g. the routers as the switches realise them; `fields` are
    the view's."""
    fields: Mapping[str, frozenset[str]]
    owners: Mapping[str, int] = field(default_factory=dict)
    refs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    quiet: tuple[str, ...] = ()
    view: Callable[[Snapshot, Views | None], Snapshot] | None = None


@dataclass(frozen=True)
class App:
    name: str
    app_id: int
    tables: Mapping[str, tuple[str, ...]]          # bridge kind -> tables the app fills
    # Every callable takes, last, the Views of the model (fathom.model.views; None: made afresh)
    compile: Callable[[Snapshot, Views | None], dict[SwitchKey, SwitchState]]
    # model, union of every app's `compile` -> more desired state (switches that follow others)
    derive: Callable[[Snapshot, Mapping[SwitchKey, SwitchState], Views | None],
                     dict[SwitchKey, SwitchState]] | None = None
    # Incremental compilation (optional): `touched(before, after)` names the owners (`Owner`) whose
    # flows may differ between two models, or says why it cannot tell (a str: the reason; then the
    # app is compiled whole); `compile_owners(model, owners)` is the desired state of exactly those
    # owners on every switch. An owner may also be named on one switch only (`OwnerOn`): its flows
    # elsewhere stay as they are. An app without `touched` is compiled whole on every pass; one
    # without `compile_owners` (whose owners rarely change, e.g. the pipeline skeleton) gets
    # fathom.apps.compile_owners's fallback: compile, then keep the owners' part.
    touched: Callable[[Snapshot, Snapshot, Views | None], "set[Owner | OwnerOn] | str"] | None = None
    compile_owners: Callable[[Snapshot, frozenset, Views | None], dict[SwitchKey, SwitchState]] | None = None
    # Status (optional): `status(model, agents)` -> the problems the app finds with the objects it
    # owns (`Problem`: the object, a severity, the reason), from the model and what the nodes' agents
    # last said ((owner kind, id) -> status). fathom.controller.status merges them with what the
    # switches say of the objects' flows; an object no app has a problem with is as its flows are.
    status: Callable[[Snapshot, Mapping[tuple[str, int], Status], Views | None], Iterable[Problem]] | None = None
    # What `compile` reads (checked by tests/unit/test_app_reads.py); with `owners`, `touched` is
    # fathom.apps.incremental.declared_touched's, unless the app writes its own (saying why).
    reads: Reads | None = None
    # Reach (optional): `reach(model, write)` names the nodes whose switches (br-int, br-phy) the
    # app's state may differ on after a port's write (`PortWrite`) from the model before it, or None:
    # any switch. An app without it may change any switch (fathom.apps.port_write_reach; checked
    # over random models by tests/unit/test_port_reach.py).
    reach: Callable[[Snapshot, PortWrite], frozenset[str] | None] | None = None
