"""The lab's error and its readiness check; commands in its namespaces run through fathom.host.exec."""
from __future__ import annotations

import functools
import os
import shutil

from fathom.host import exec as host_exec


class LabError(Exception):
    pass


# fathom.host.exec.run, raising LabError (what every lab caller handles)
run = functools.partial(host_exec.run, error=LabError)


def require_root_and_tools(tools=("ovs-vswitchd", "ovsdb-server", "ovs-vsctl", "ip", "ethtool")) -> None:
    """One line saying what to run when the machine is not ready."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (namespaces, veth, OVS): run it with sudo")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise LabError(f"{', '.join(missing)} not found: run 'sudo scripts/setup' (installs Open vSwitch and friends)")
