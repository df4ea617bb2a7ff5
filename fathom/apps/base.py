"""What an app is (`App`) and how it names the switches it programs (`SwitchKey`); fathom/apps/__init__.py
says how apps are run. The apps import this module, and the registry imports the apps."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from fathom.model import Snapshot
from fathom.openflow.spec import SwitchState

BR_INT, BR_PHY, TOR = "br-int", "br-phy", "tor"


@dataclass(frozen=True, order=True)
class SwitchKey:
    """One switch fathom programs: a node's br-int or br-phy (name = node name) or a ToR (its name)."""
    bridge: str
    name: str

    def __str__(self) -> str:
        return f"{self.bridge} {self.name}"


@dataclass(frozen=True)
class App:
    name: str
    app_id: int
    tables: Mapping[str, tuple[str, ...]]          # bridge kind -> tables the app fills
    compile: Callable[[Snapshot], dict[SwitchKey, SwitchState]]
    # model, union of every app's `compile` -> more desired state (switches that follow others)
    derive: Callable[[Snapshot, Mapping[SwitchKey, SwitchState]], dict[SwitchKey, SwitchState]] | None = None
