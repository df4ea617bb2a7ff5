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


# What runs programs or enters namespaces on a host: only the agent, the lab, PPTMon chains and the
# benchmarks may import these, never the controller process (its API included).
HOST_COMMANDS = ("subprocess", "pyroute2", "ctypes", "pty", "os.system")
HOST_MODULES = ("fathom.host", "fathom.lab", "fathom.agent", "fathom.pptmon.control", "fathom.pptmon.chain",
                "fathom.pptmon.measure", "fathom.pptmon.traffic", "fathom.pptmon.demo", "fathom.bench")


def _external_imports(path) -> set[str]:
    import ast
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                and node.attr in ("system", "popen", "execv", "execvp", "setns", "unshare", "fork"):
            out.add(f"os.{node.attr}")
    return out


def test_the_controller_and_the_api_run_no_host_command():
    """Everything the controller process loads (fathom.controller, fathom.api and what they import,
    transitively) neither imports a host-command module of fathom nor subprocess, pyroute2, ctypes
    or os.system/fork/setns: on a real cloud the controller is on another machine, and it reaches the
    nodes only over OpenFlow and OVSDB; host work is the node agent's."""
    from .test_import_cycles import _modules
    graph, paths = import_graph(), _modules()
    seen, todo = set(), [m for m in graph if under(m, ("fathom.controller", "fathom.api"))]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    assert "fathom.controller.server" in seen and "fathom.api.agents" in seen and "fathom.store.agents" in seen
    wrong = sorted(m for m in seen if under(m, HOST_MODULES))
    assert not wrong, wrong
    commands = sorted((m, x) for m in seen for x in _external_imports(paths[m])
                      if any(x == c or x.startswith(c + ".") for c in HOST_COMMANDS))
    assert not commands, commands


def test_the_host_command_check_sees_a_command():
    """The check above is not vacuous: the agent's modules are caught by it."""
    from .test_import_cycles import _modules
    paths = _modules()
    assert "subprocess" in _external_imports(paths["fathom.agent.pptmon"])
    assert any(under(d, HOST_MODULES) for d in import_graph()["fathom.agent.routers"])


def test_the_reconciler_desired_state_does_no_io():
    """The reconciler's desired state (fathom.controller.desired and .edits) is pure: it imports no
    store, no switch session, no OpenFlow socket, no API; only what compiles and what it counts."""
    allowed = ("fathom.model", "fathom.openflow", "fathom.pipeline", "fathom.apps", "fathom.addresses",
               "fathom.controller.edits", "fathom.controller.metrics", "fathom.controller.status")
    graph = import_graph()
    wrong = sorted((m, d) for m in ("fathom.controller.desired", "fathom.controller.edits") for d in graph[m]
                   if d not in ("fathom", "fathom.controller") and not under(d, allowed))
    assert graph["fathom.controller.desired"] and not wrong, wrong
