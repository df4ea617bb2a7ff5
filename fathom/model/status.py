"""What the apps say about the status of the objects they own: typed problems, each with its
severity and the object it is about (an app's `status`, fathom/apps/base.py), merged with what the
switches and agents say by fathom.controller.status.

A status is (status, reason): `active`, `pending` (something awaited: a switch connecting, a port
being plugged), `error` (something that will not pass by itself), or `down` (a port); `worst`
merges several into one.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

Status = tuple[str, str | None]


class Severity(Enum):
    """How bad a problem is, as the status it gives its object."""
    WARNING = "active"      # the object works; the reason says what it lacks (shown while nothing worse)
    PENDING = "pending"     # awaited: it passes by itself once what is missing comes
    ERROR = "error"         # it does not pass by itself: the user must change something


@dataclass(frozen=True)
class Problem:
    """One thing an app found wrong with an object it owns. `about`: the object, (status kind, id).
    `replaces_flows`: the app could not (wholly) compile the object, so what the switches say of its
    flows does not count (the problem is its status); otherwise the problem adds to it (e.g. the
    agents that hold a port chain's PPTMon programs)."""
    about: tuple[str, int]
    severity: Severity
    reason: str
    replaces_flows: bool = True

    @property
    def status(self) -> Status:
        return self.severity.value, self.reason


def worst(statuses: list[Status]) -> Status:
    """The status of an object made of parts: `error` if any part is, else `pending` if any part is
    not active, with the reasons of the parts not active (sorted, once each)."""
    bad = [s for s in statuses if s[0] != "active"]
    if not bad:
        return "active", None
    level = "error" if any(s[0] == "error" for s in bad) else "pending"
    return level, "; ".join(sorted({s[1] for s in bad if s[1]}))
