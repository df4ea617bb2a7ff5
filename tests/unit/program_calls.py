"""Which programs the code runs, read from the code alone (whatever the machine has installed).

A program is named where an argv is built for something that runs it: the first element of a list
given to subprocess, os.exec* or one of fathom's runners (after `ip netns exec NS`, the command it
runs too), and the first of the separate arguments given to a wrapper such as `lab.run(vm, "ping",
...)`. fathom's runners and wrappers are found in the code: a function whose parameter reaches the
program position of a runner is one itself, at that parameter's position.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

# The runners everything else is built on: callee -> position of the argv among positional arguments.
SEED_ARGV = {"subprocess.run": 0, "subprocess.Popen": 0, "subprocess.call": 0, "subprocess.check_call": 0,
             "subprocess.check_output": 0, "os.execvp": 1, "os.execvpe": 1, "os.execv": 1,
             # fathom.host.exec.argv builds the argv from its first argument in a comprehension;
             # fathom.lab.sh.run is functools.partial(fathom.host.exec.run, ...)
             "fathom.host.exec.argv": 0, "fathom.lab.sh.run": 0,
             # Lab.exec_args(target, cmd) returns the argv that runs cmd in a namespace
             "fathom.lab.lab.Lab.exec_args": 1}
# A command that runs its tail as another command: its prefix length.
RUNS_ITS_TAIL = {("ip", "netns", "exec"): 4}


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)   # local name -> qualified name
    defs: dict[str, str] = field(default_factory=dict)      # top-level function name -> qualified name


def _module_name(root: Path, path: Path) -> str:
    if not path.is_relative_to(root):
        return path.stem
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def load(root: Path, paths) -> list[Module]:
    mods = []
    for path in paths:
        m = Module(_module_name(root, path), path, ast.parse(path.read_text(), str(path)))
        package = m.name.rsplit(".", 1)[0] if path.name != "__init__.py" else m.name
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    m.imports[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    m.imports[a.asname or a.name] = f"{base}.{a.name}"
        for node in m.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                m.defs[node.name] = f"{m.name}.{node.name}"
        mods.append(m)
    return mods


def _functions(m: Module):
    """(qualified name, def) for top-level functions and methods (`Class.method`)."""
    for node in m.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{m.name}.{node.name}", node, None
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{m.name}.{node.name}.{sub.name}", sub, node.name


def callee(m: Module, call: ast.Call, cls: str | None) -> str | None:
    """The qualified name a call refers to, as far as one module shows it: `run` imported from
    fathom.lab.sh -> fathom.lab.sh.run; `self.f` in class C -> module.C.f; `x.lab.run` -> `*.lab.run`
    (an attribute named after the object, the way the code names a Lab)."""
    f = call.func
    if isinstance(f, ast.Name):
        return m.defs.get(f.id) or m.imports.get(f.id) or f.id
    if isinstance(f, ast.Attribute):
        base = f.value
        if isinstance(base, ast.Name):
            if base.id in m.imports:
                return f"{m.imports[base.id]}.{f.attr}"
            if base.id in ("self", "cls") and cls:
                return f"{m.name}.{cls}.{f.attr}"
            return f"*.{base.id}.{f.attr}"
        if isinstance(base, ast.Attribute):
            return f"*.{base.attr}.{f.attr}"
    return None


def _word(e: ast.expr) -> str | None:
    """The program an argv element names: "ip", str(BIN / "initdb"), BIN / "initdb"."""
    if isinstance(e, ast.Constant) and isinstance(e.value, str):
        return e.value.rsplit("/", 1)[-1]
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "str" and len(e.args) == 1:
        return _word(e.args[0])
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Div):
        return _word(e.right)
    return None


def _program_elements(e: ast.expr):
    """The elements at program positions of an argv expression (a list literal, `a + b`, `a if c else b`)."""
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
        yield from _program_elements(e.left)
        if isinstance(e.left, ast.List) and not e.left.elts:
            yield from _program_elements(e.right)
    elif isinstance(e, ast.IfExp):
        yield from _program_elements(e.body)
        yield from _program_elements(e.orelse)
    elif isinstance(e, (ast.List, ast.Tuple)):
        elts = e.elts
        i = 0
        while i < len(elts) and isinstance(elts[i], ast.Starred) and not isinstance(elts[i].value, ast.Name):
            i += 1            # [*_as_postgres(), prog, ...]: a prefix that may be empty
        if i < len(elts):
            yield elts[i]
            words = tuple(_word(x) for x in elts[i:i + 3])
            for prefix, n in RUNS_ITS_TAIL.items():
                if words == prefix and i + n < len(elts):
                    yield elts[i + n]
    else:
        yield e


def scan(mods: list[Module]) -> list[tuple[str, Module, int]]:
    """Every (program, module, line) the code names at a program position."""
    argv_at = dict(SEED_ARGV)       # callee -> position of its argv argument
    words_at: dict[str, int] = {}   # callee -> position of the program among separate arguments

    def program_args(call, name):
        """The argument expressions at program positions of a call to `name`."""
        out = []
        if name in argv_at and len(call.args) > argv_at[name]:
            out.append(("argv", call.args[argv_at[name]]))
        for kw in call.keywords:
            if kw.arg in ("args", "cmd") and name in argv_at:
                out.append(("argv", kw.value))
        if name in words_at and len(call.args) > words_at[name]:
            out.append(("word", call.args[words_at[name]]))
        return out

    def resolve(name):
        if name is None:
            return None
        if name in argv_at or name in words_at:
            return name
        if name.startswith("*."):   # an attribute call on an object: a method of that name
            attr = name.rsplit(".", 1)[1]
            obj = name.split(".")[1]
            hits = {k for k in [*argv_at, *words_at] if k.lower().endswith(f".{obj.lower()}.{attr}")}
            return hits.pop() if len(hits) == 1 else None
        return None

    # each function's calls, read once: (module, qualified name, class, parameters, *parameter, calls, argv variables)
    units = []
    for m in mods:
        for qual, fn, cls in _functions(m):
            params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
            if cls and params[:1] in (["self"], ["cls"]):
                params = params[1:]
            calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)]
            units.append((m, qual, cls, params, fn.args.vararg.arg if fn.args.vararg else None, calls,
                          _argv_variables(fn)))
    def program_elements(m, calls, cls, argvars):
        """The expressions at program positions (an argv's first element, a program word) of `calls`."""
        for call in calls:
            name = resolve(callee(m, call, cls))
            if name:
                for kind, e in program_args(call, name):
                    yield from [e] if kind == "word" else _elements(e, argvars)

    # runners and wrappers found in the code: repeat until nothing new
    changed = True
    while changed:
        changed = False
        for m, qual, cls, params, vararg, calls, argvars in units:
            if qual in argv_at or qual in words_at:
                continue
            for el in program_elements(m, calls, cls, argvars):
                target = _unwrap_list(el.value if isinstance(el, ast.Starred) else el)
                if not isinstance(target, ast.Name) or qual in argv_at or qual in words_at:
                    continue
                if target.id == vararg:
                    words_at[qual] = len(params)
                    changed = True
                elif target.id in params:
                    argv_at[qual] = params.index(target.id)
                    changed = True

    found = []
    for m, qual, cls, params, vararg, calls, argvars in units + [
            (m, m.name, None, [], None, [c for c in _module_level(m.tree) if isinstance(c, ast.Call)],
             _argv_variables(m.tree)) for m in mods]:
        for el in program_elements(m, calls, cls, argvars):
            word = _word(el)
            if word:
                found.append((word, m, el.lineno))
    return found


def _module_level(tree: ast.Module):
    """The nodes of a module outside its functions and methods."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def _unwrap_list(e: ast.expr) -> ast.expr:
    """list(cmd), tuple(cmd) -> cmd."""
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in ("list", "tuple") and e.args:
        return e.args[0]
    return e


def _argv_variables(scope) -> dict[str, list[ast.expr]]:
    """Names assigned a list literal (or a sum of them) in a scope: `cmd = ["tcpdump", ...]`."""
    out: dict[str, list[ast.expr]] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, (ast.List, ast.Tuple, ast.BinOp, ast.IfExp)):
                out.setdefault(node.targets[0].id, []).append(node.value)
    return out


def _elements(e: ast.expr, argvars):
    """The program-position elements of an argv argument; one given by name stands for each list
    assigned to that name."""
    for src in argvars.get(e.id, [e]) if isinstance(e, ast.Name) else [e]:
        yield from _program_elements(src)
