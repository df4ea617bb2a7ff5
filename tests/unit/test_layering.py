"""The layering of fathom's modules, read from their source (every import, at module level or inside
a function): the model, openflow and pipeline never reach up into the store, API, controller, lab,
benchmarks or CLI. tests/unit/test_import_cycles.py checks that no modules import each other."""
from __future__ import annotations

from .test_import_cycles import import_graph

LOW = ("fathom.model", "fathom.openflow", "fathom.pipeline")
HIGH = ("fathom.store", "fathom.api", "fathom.controller", "fathom.lab", "fathom.bench", "fathom.cli")


def under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_model_openflow_and_pipeline_import_nothing_above_them():
    wrong = sorted((m, d) for m, deps in import_graph().items() if under(m, LOW) for d in deps if under(d, HIGH))
    assert not wrong, wrong


def test_the_walk_sees_imports():
    deps = import_graph()
    assert "fathom.model" in deps["fathom.store.snapshot"]
    assert "fathom.apps.tenant.compiler" in deps["fathom.apps.tenant"]
    # a late import inside a function counts
    assert "fathom.apps.fabric" in deps["fathom.apps"]


def test_compilers_import_only_the_model_openflow_the_pipeline_and_leaf_helpers():
    """Apps compile the model into flows: pure functions that import nothing with I/O or state."""
    allowed = ("fathom.model", "fathom.openflow", "fathom.pipeline", "fathom.apps", "fathom.addresses")
    wrong = sorted((m, d) for m, deps in import_graph().items() if under(m, ("fathom.apps", *LOW))
                   for d in deps if d.startswith("fathom") and not under(d, allowed) and d != "fathom")
    assert not wrong, wrong
