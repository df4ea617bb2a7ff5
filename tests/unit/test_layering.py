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


def test_the_trace_interpreter_imports_only_the_model_openflow_and_the_pipeline():
    """A simulated trace reads the model and compiled states, like the compilers: pure."""
    allowed = ("fathom.model", "fathom.openflow", "fathom.pipeline", "fathom.trace")
    wrong = sorted((m, d) for m, deps in import_graph().items() if under(m, ("fathom.trace",))
                   for d in deps if d.startswith("fathom") and not under(d, allowed) and d != "fathom")
    assert not wrong, wrong
    assert "fathom.trace.tables" in import_graph()["fathom.trace.walk"]


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


# ---------------------------------------------------------------------------------------------- apps
# An app is a folder of fathom/apps (its compiler, its status); fathom/apps/__init__.py (the registry),
# base.py (the App interface) and incremental.py (helpers for `touched`) are what every app shares.
SHARED = ("fathom.apps", "fathom.apps.base", "fathom.apps.incremental")


def app_of(module: str) -> str | None:
    """The app a module belongs to (fathom.apps.<app>...), None for any other module."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["fathom", "apps"] and module not in SHARED else None


def test_the_status_model_knows_no_app():
    """controller/status.py merges what the apps say (App.status); it imports no app's module."""
    wrong = sorted(d for d in import_graph()["fathom.controller.status"] if app_of(d))
    assert not wrong, wrong


def test_the_store_and_the_api_import_no_app():
    """What the store checks and the API shows (vocabularies, limits, markers) is the model's."""
    found = {(m, d) for m, deps in import_graph().items() if under(m, ("fathom.store", "fathom.api"))
             for d in deps if under(d, ("fathom.apps",))}
    assert not found, sorted(found)


def test_no_app_imports_another():
    """What two apps share lives below them (fathom/openflow, fathom/model) or in SHARED."""
    found = {(m, d) for m, deps in import_graph().items() if app_of(m)
             for d in deps if app_of(d) and app_of(d) != app_of(m)}
    assert not found, sorted(found)


def test_every_route_is_in_the_api():
    """Only fathom/api defines REST routes (a FastAPI router or app and its endpoints); the
    controller passes its runtime in (fathom.api.runtime)."""
    import ast
    from .test_import_cycles import _modules

    def defines_routes(path) -> bool:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name in ("APIRouter", "FastAPI", "add_api_route", "api_route"):
                    return True
        return False

    routed = {m for m, path in _modules().items() if defines_routes(path)}
    assert {"fathom.api.taps", "fathom.api.runtime"} <= routed      # the check sees routes
    wrong = sorted(m for m in routed if not under(m, ("fathom.api",)))
    assert not wrong, wrong


def test_the_app_checks_see_an_app_import():
    assert app_of("fathom.apps.vtap.compiler") == "vtap" and app_of("fathom.apps.base") is None
    assert any(app_of(d) == "tenant" for d in import_graph()["fathom.apps.tenant"])


def test_the_reconciler_desired_state_does_no_io():
    """The reconciler's desired state (fathom.controller.desired and .edits) is pure: it imports no
    store, no switch session, no OpenFlow socket, no API; only what compiles and what it counts."""
    allowed = ("fathom.model", "fathom.openflow", "fathom.pipeline", "fathom.apps", "fathom.addresses",
               "fathom.controller.edits", "fathom.controller.metrics", "fathom.controller.status")
    graph = import_graph()
    wrong = sorted((m, d) for m in ("fathom.controller.desired", "fathom.controller.edits") for d in graph[m]
                   if d not in ("fathom", "fathom.controller") and not under(d, allowed))
    assert graph["fathom.controller.desired"] and not wrong, wrong
