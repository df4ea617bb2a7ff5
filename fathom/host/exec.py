"""Running a command, optionally inside a network namespace; a failure carries the command and
what it printed.

The one way fathom runs programs: the lab (fathom.lab), the node agent (fathom.agent: router
namespaces, PPTMon loaders, facts), PPTMon chains and measurements (fathom.pptmon), benchmarks.
Never the controller or the API (tests/unit/test_layering.py).

    run(["ip", "link", "show"], ns="lab-compute1")           # CompletedProcess, text, captured
    run([...], check=False)                                   # a failure is the caller's to judge
    run([...], error=LabError)                                # raise the caller's own error class
    argv(["iperf3", "-s"], ns="x")                            # for Popen: ip netns exec x iperf3 -s
"""
from __future__ import annotations

import os
import subprocess
from typing import Sequence

from fathom import programs


class CommandError(RuntimeError):
    """A command failed or timed out. `cmd` is the full argv; `returncode` is None on a timeout."""

    def __init__(self, message: str, cmd: Sequence[str] = (), returncode: int | None = None, stderr: str = ""):
        super().__init__(message)
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stderr = stderr


def argv(cmd: Sequence[object], ns: str | None = None) -> list[str]:
    """The argv that runs `cmd` in namespace `ns` (or here, when None)."""
    return (["ip", "netns", "exec", ns] if ns else []) + [str(c) for c in cmd]


def run(cmd: Sequence[object], ns: str | None = None, *, env: dict | None = None, check: bool = True,
        timeout: float = 60, input: str | None = None,
        error: type[Exception] = CommandError) -> subprocess.CompletedProcess:
    """Run `cmd` (in namespace `ns`), capture its output as text. `env` adds to the environment.
    With `check`, a non-zero exit raises `error` naming the command and its stderr (or stdout);
    a timeout or a program that is not installed (message from fathom.programs) always raises it."""
    full = argv(cmd, ns)
    for program in {full[0], full[len(full) - len(cmd)]}:
        if "/" not in program and programs.path(program) is None:
            raise _error(error, programs.missing_message(program), full, None, "")
    try:
        proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, input=input,
                              env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired:
        raise _error(error, f"timed out after {timeout:g}s: {' '.join(full)}", full, None, "") from None
    if check and proc.returncode != 0:
        said = proc.stderr.strip() or proc.stdout.strip()
        raise _error(error, f"command failed ({proc.returncode}): {' '.join(full)}\n{said}", full,
                     proc.returncode, proc.stderr)
    return proc


def _error(error: type[Exception], message: str, cmd, returncode, stderr) -> Exception:
    if issubclass(error, CommandError):
        return error(message, cmd, returncode, stderr)
    return error(message)


def namespaces() -> list[str]:
    """Names of the network namespaces `ip netns` knows."""
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []
