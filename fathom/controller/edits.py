"""What a pass takes out of and puts into a switch's desired state (`Edit`), and a state made from
an older one by such an edit without copying its flows (`Edited`).

The desired state (fathom.controller.desired) records an edit per switch whose owners it replaced;
the switch is then told only the edit (fathom.controller.apply), so a pass's cost follows the
change, not the switch's flows.
"""
from __future__ import annotations

from fathom.apps import SwitchKey
from fathom.openflow.spec import SwitchState


class Edit:
    """What a pass took out of and put into one switch's desired state, as parts' states (united
    once at the end of the compile: see DesiredState.update)."""
    __slots__ = ("gone", "new", "_united")

    def __init__(self):
        self.gone: list[SwitchState] = []
        self.new: list[SwitchState] = []
        self._united: tuple[SwitchState, SwitchState] | None = None

    def united(self) -> tuple[SwitchState, SwitchState]:
        """(everything taken out, everything put in), each as one state."""
        if self._united is None:
            self._united = (union(self.gone), union(self.new))
        return self._united


def record_edit(edits: dict | None, key: SwitchKey, gone, new) -> None:
    """Add to `key`'s edit in `edits` (None: no edits kept) the states `gone` and `new`."""
    if edits is not None:
        edit = edits.get(key) or edits.setdefault(key, Edit())
        edit.gone.extend(gone)
        edit.new.extend(new)
        edit._united = None


def union(states) -> SwitchState:
    """One state holding all of `states` (built once, with no state in between; the one state
    itself when there is one)."""
    states = list(states)
    if len(states) == 1:
        return states[0]
    return SwitchState(frozenset().union(*(s.flows for s in states)), frozenset().union(*(s.groups for s in states)),
                       frozenset().union(*(s.meters for s in states)))


def edited(state: SwitchState, edit: "Edit") -> "Edited":
    """`state` without what `edit` took out and with what it put in, where the edit's states are
    owners' (an owner's flows, groups and meters are its own: no other owner holds them)."""
    gone, new = edit.united()
    return Edited(state, gone.flows, new.flows, _edit_set(state.groups, gone.groups, new.groups),
                   _edit_set(state.meters, gone.meters, new.meters))


def _edit_set(held: frozenset, out: frozenset, into: frozenset) -> frozenset:
    """`held` without `out` and with `into` (what is in both stays)."""
    out, into = out - into, into - out
    if not out:
        return held | into if into else held
    if not into:
        return held - out
    kept = set(held)
    kept -= out
    kept |= into
    return frozenset(kept)


UNITE_AFTER = 32   # edits an edited switch state chains before it is made whole (see Edited)


class Edited(SwitchState):
    """A switch's state as an older one edited by a pass (`edited`): its flows are made whole only
    when read, or once it chains UNITE_AFTER edits.

    A port's pass at 100 nodes changes every switch by a few of its ~14,000 flows; the switch is
    told only the edit (DesiredState.edits: within one owner's flows, what it loses is `gone - got`,
    what it gains `got - gone`), so nothing in a pass needs the whole set unless the fabric switch's derive,
    a whole diff, an audit or the API's views read it. Copying and freeing each switch's set on
    every change cost a port's pass at 100 x 100 about a fifth of its CPU; now one pass in
    UNITE_AFTER does. Equal to, and hashed like, the SwitchState with the same contents; safe to
    read from any thread (a second reader in between makes the same set)."""

    def __init__(self, base: SwitchState, out: frozenset, into: frozenset, groups: frozenset, meters: frozenset):
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_edit", (out - into, into - out))
        object.__setattr__(self, "_flows", None)
        object.__setattr__(self, "_from", id(base))
        object.__setattr__(self, "_depth", base._depth + 1 if isinstance(base, Edited) and base._flows is None else 1)
        SwitchState.groups.__set__(self, groups)     # the frozen base's own slots
        SwitchState.meters.__set__(self, meters)
        if self._depth >= UNITE_AFTER:
            self.unite()

    def follows(self, state: SwitchState) -> bool:
        """Whether this state is `state` edited (`state` alive: its id is its own)."""
        return self._from == id(state)

    @property
    def flows(self) -> frozenset:
        return self.unite()

    def unite(self) -> frozenset:
        """The flows, made whole once: the nearest whole state down the chain, and the edits since."""
        flows = self._flows
        if flows is not None:
            return flows
        edits, state = [], self
        while isinstance(state, Edited) and state._flows is None:
            base = state._base
            if base is None:            # another thread made it whole meanwhile
                break
            edits.append(state._edit)
            state = base
        if state is self:
            return self._flows
        held = set(state.flows)
        for out, into in reversed(edits):
            held -= out
            held |= into
        flows = frozenset(held)
        object.__setattr__(self, "_flows", flows)
        object.__setattr__(self, "_base", None)     # the chain below is freed with its last reader
        return flows

    def __eq__(self, other):
        if not isinstance(other, SwitchState):
            return NotImplemented
        return (self.flows, self.groups, self.meters) == (other.flows, other.groups, other.meters)

    def __hash__(self):
        return hash((self.flows, self.groups, self.meters))

    def __repr__(self):
        return f"SwitchState(flows={self.flows!r}, groups={self.groups!r}, meters={self.meters!r})"

