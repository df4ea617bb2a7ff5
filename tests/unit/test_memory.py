"""What the reconciler keeps is plain data the garbage collector need not walk: passes leave no
cycles among the model, its derived views and the desired state, and a controller that freezes its
memory (as `fathom controller` does) keeps its desired state out of the collector's
generations."""
from __future__ import annotations

import gc
import threading
import time

from fathom.apps.secgroups.compiler import Index
from fathom.model import Port, Snapshot
from fathom.openflow.spec import FlowSpec, SwitchState

from .test_incremental import new_port, plug, unplug
from .test_reconciler import LAB, Cloud

KEPT = (Snapshot, Port, Index, SwitchState, FlowSpec)


def _changes(cloud, rounds: int) -> None:
    for i in range(rounds):
        p = new_port(cloud, f"m{i}", "compute1")
        plug(cloud, "compute1", f"m{i}", 80 + i)
        cloud.rec.run_pass(audit=False)
        unplug(cloud, "compute1", f"m{i}")
        cloud.call("DELETE", f"/ports/{p['id']}")
        cloud.rec.run_pass(audit=False)


def test_passes_leave_no_cycles_among_the_model_and_the_desired_state(tmp_path):
    cloud = Cloud(tmp_path, LAB / "default.yaml")
    try:
        cloud.rec.run_pass()
        _changes(cloud, 1)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            _changes(cloud, 3)
            cloud.rec.run_pass()       # an audit: the store read whole, every app compiled whole
            gc.collect()
            cyclic = [type(o).__name__ for o in gc.garbage if isinstance(o, KEPT)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert cyclic == []
    finally:
        cloud.close()


def test_a_controller_that_freezes_its_memory_keeps_its_desired_state_out_of_the_collector(tmp_path):
    cloud = Cloud(tmp_path, LAB / "default.yaml")
    try:
        cloud.rec.freeze_memory, cloud.rec.freeze_every = True, 0.0
        cloud.rec.run_pass()
        _changes(cloud, 1)
        flows = {id(f) for state in cloud.rec.desired.states.values() for f in state.flows}
        assert flows and gc.get_freeze_count() > 0
        walked = {id(o) for o in gc.get_objects()}
        assert not flows & walked
    finally:
        gc.unfreeze()
        cloud.close()


def test_passes_in_a_row_share_a_freeze_and_the_last_one_is_frozen_when_the_loop_goes_quiet(tmp_path):
    cloud = Cloud(tmp_path, LAB / "default.yaml")
    loop = None
    try:
        cloud.rec.freeze_memory, cloud.rec.freeze_every = True, 60.0
        cloud.rec.run_pass()                       # frozen: none before it
        new_port(cloud, "m0", "compute1")         # two passes within the minute: not yet
        plug(cloud, "compute1", "m0", 80)
        cloud.rec.run_pass(audit=False)
        cloud.rec.run_pass(audit=False)
        flows = {id(f) for state in cloud.rec.desired.states.values() for f in state.flows}
        assert cloud.rec._freeze_due and flows & {id(o) for o in gc.get_objects()}
        cloud.rec.freeze_every = 0.2
        loop = threading.Thread(target=cloud.rec.run_forever, daemon=True)
        loop.start()
        deadline = time.monotonic() + 5
        while cloud.rec._freeze_due and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not cloud.rec._freeze_due
        assert not flows & {id(o) for o in gc.get_objects()}
    finally:
        cloud.rec.stop()
        if loop is not None:
            loop.join(10)
        gc.unfreeze()
        cloud.close()
