"""Running commands in the lab's namespaces. Errors carry the command and what it printed."""
from __future__ import annotations

import os
import subprocess

from fathom import programs


class LabError(Exception):
    pass


def run(cmd: list[str], ns: str | None = None, env: dict | None = None, check: bool = True,
        timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
    full = (["ip", "netns", "exec", ns] if ns else []) + [str(c) for c in cmd]
    for program in {full[0], str(cmd[0])}:
        if "/" not in program and programs.path(program) is None:
            raise LabError(programs.missing_message(program))
    try:
        proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, input=input,
                              env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired:
        raise LabError(f"timed out after {timeout}s: {' '.join(full)}")
    if check and proc.returncode != 0:
        raise LabError(f"command failed ({proc.returncode}): {' '.join(full)}\n{proc.stderr.strip()}")
    return proc


def require_root_and_tools(tools=("ovs-vswitchd", "ovsdb-server", "ovs-vsctl", "ip", "ethtool")) -> None:
    """One line saying what to run when the machine is not ready."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, veth, OVS): run it with sudo")
    try:
        programs.require(*tools)
    except programs.ProgramMissing as e:
        raise LabError(str(e)) from None
