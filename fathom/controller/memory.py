"""The controller's memory and CPython's cyclic garbage collector: what passes keep (every
switch's desired state, the model, their indexes) is frozen out of the collector's reach, and the
collector's thresholds are raised in the controller's process."""
from __future__ import annotations

import gc

# Seconds between two freezes of the controller's memory (`freeze`) while passes follow
# each other: the collection before a freeze walks the new states still alive (at 100 nodes x 100
# ports, one port's pass puts a new state on every switch: about 140 ms a freeze), whatever the
# number of passes since the last one, so passes in a row share one every few seconds; the last
# one's is done when the loop goes quiet.
FREEZE_EVERY = 5.0
# The collector's thresholds in the controller's process (fathom.controller.server). A pass makes
# millions of objects at a hundred nodes, most of which it keeps (the desired state): CPython's
# defaults (a young collection every 700 allocations) make the collector walk them again and again
# while they are made, and a whole compile of 100 nodes x 100 ports took 3x as long (security
# groups: 41 s against 13-19 s). A young collection counts allocations less frees, and walks every
# young container alive, each switch's new state among them (a set of some 14,000 flows at 100 x
# 100, where a port's pass gives every switch a new one): at 50,000 one came every sixth pass or
# so and held the interpreter for 160-210 ms in the middle of a port's pass. At 200,000, passes in
# a row are frozen (FREEZE_EVERY: a full collection, after a pass's statuses are out) before one
# comes; what cyclic garbage the API makes meanwhile waits for at most that many allocations.
GC_THRESHOLDS = (200_000, 20, 10)


def freeze() -> None:
    """Put what is alive now out of the cyclic garbage collector's reach (gc.freeze), after
    collecting what is not (gc.collect walks only what is not frozen yet: about what the passes
    since the last freeze made, so it costs what the changes cost: see FREEZE_EVERY).

    The controller keeps every switch's desired state, the model and their indexes: at 100 nodes x
    100 ports tens of millions of objects, immutable and free of cycles (tests/unit/test_memory.py),
    which CPython's full collections would walk, every one of them, each time a quarter as many
    again had been made: a pause of seconds with the interpreter held, long enough for the nodes'
    OVSDB servers to drop the controller. Frozen objects are still freed when their last reference
    goes; what a freeze catches that ends up in a cycle later (a switch's connection objects when it
    disconnects) is never collected: a few kilobytes a reconnect."""
    gc.collect()
    gc.freeze()
