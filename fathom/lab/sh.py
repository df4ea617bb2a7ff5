"""The lab's error and its readiness check; commands in its namespaces run through fathom.host.exec."""
from __future__ import annotations

import functools
import os

from fathom import programs
from fathom.host import exec as host_exec


class LabError(Exception):
    pass


# fathom.host.exec.run, raising LabError (what every lab caller handles)
run = functools.partial(host_exec.run, error=LabError)


def require_root_and_tools(tools=("ovs-vswitchd", "ovsdb-server", "ovs-vsctl", "ip", "ethtool")) -> None:
    """One line saying what to run when the machine is not ready."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, veth, OVS): run it with sudo")
    try:
        programs.require(*tools)
    except programs.ProgramMissing as e:
        raise LabError(str(e)) from None
