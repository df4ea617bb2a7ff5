"""One Open vSwitch instance (ovsdb-server + ovs-vswitchd) inside a network namespace.

Each instance has its own run dir holding the database, sockets, pid files and logs, so many
instances coexist on one machine; the userspace (netdev) datapath needs no kernel module.
A lab's instances run under a supervisor (fathom.lab.supervisor) that restarts a crashed daemon;
`start_ovsdb` / `start_vswitchd` then ask it to start a stopped one, as `systemctl start` would.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from .sh import LabError, run

SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"


class OvsInstance:
    def __init__(self, netns: str, rundir: str | Path):
        self.netns = netns
        self.rundir = Path(rundir)

    @property
    def env(self) -> dict:
        d = str(self.rundir)
        return {"OVS_RUNDIR": d, "OVS_LOGDIR": d, "OVS_DBDIR": d, "OVS_PKGDATADIR": "/usr/share/openvswitch"}

    @property
    def db_sock(self) -> str:
        return str(self.rundir / "db.sock")

    def start(self) -> None:
        """Create the database if needed and start both daemons, unsupervised (see fathom.lab.supervisor)."""
        self.create_db()
        self.spawn("ovsdb-server")
        self.init_db()
        self.spawn("ovs-vswitchd")

    def create_db(self) -> None:
        self.rundir.mkdir(parents=True, exist_ok=True)
        db = self.rundir / "conf.db"
        if not db.exists():
            run(["ovsdb-tool", "create", db, SCHEMA])

    def init_db(self) -> None:
        version = run(["ovs-vswitchd", "--version"]).stdout.split()[-1]
        self.vsctl("--no-wait", "init", "--", "set", "Open_vSwitch", ".", f"ovs_version={version}")

    def spawn(self, daemon: str, timeout: float = 30) -> int:
        """Start one daemon, detached; returns once it is ready (OVS's --detach waits for that)."""
        if daemon == "ovsdb-server":
            # managers (e.g. pssl:6640 for the controller) and their TLS files live in the database,
            # so a restart keeps them
            cmd = ["ovsdb-server", self.rundir / "conf.db", f"--remote=punix:{self.db_sock}",
                   "--remote=db:Open_vSwitch,Open_vSwitch,manager_options",
                   "--private-key=db:Open_vSwitch,SSL,private_key", "--certificate=db:Open_vSwitch,SSL,certificate",
                   "--ca-cert=db:Open_vSwitch,SSL,ca_cert"]
        elif daemon == "ovs-vswitchd":
            cmd = ["ovs-vswitchd", f"unix:{self.db_sock}"]
        else:
            raise ValueError(f"unknown OVS daemon {daemon!r}")
        run([*cmd, "--pidfile", "--detach", "--log-file"], ns=self.netns, env=self.env, timeout=timeout)
        return self.pid(daemon)

    def start_ovsdb(self) -> None:
        self._start("ovsdb-server")

    def start_vswitchd(self) -> None:
        self._start("ovs-vswitchd")

    def _start(self, daemon: str) -> None:
        sup = supervisor_pid(self.rundir)
        if sup is None:
            self.spawn(daemon)
            return
        # supervised: the supervisor starts it (and keeps restarting it); wait until it is ready
        os.kill(sup, signal.SIGUSR1)
        wait_for(lambda: self.ready(daemon), 30, f"{daemon} started by the supervisor in {self.netns}")

    def ready(self, daemon: str) -> bool:
        """Running and done starting: its pid file is written before, so under a supervisor this
        is the supervisor's word (it records the pid once OVS's --detach has returned)."""
        state = supervised_state(self.rundir)
        if state is None or not state["running"]:
            return self.alive(daemon)
        unit = state["units"].get(daemon) or {}
        return unit.get("state") == "running" and unit.get("pid") == self.pid(daemon) and self.alive(daemon)

    def vsctl(self, *args: str, check: bool = True) -> str:
        return run(["ovs-vsctl", f"--db=unix:{self.db_sock}", "--timeout=20", *args],
                   ns=self.netns, env=self.env, check=check).stdout.strip()

    def ofctl(self, *args: str, check: bool = True) -> str:
        return run(["ovs-ofctl", "-O", "OpenFlow13", *args], ns=self.netns, env=self.env, check=check).stdout

    def appctl(self, *args: str, target: str = "ovs-vswitchd", check: bool = True) -> str:
        return run(["ovs-appctl", "-t", target, *args], ns=self.netns, env=self.env, check=check).stdout

    def pid(self, daemon: str) -> int | None:
        try:
            return int((self.rundir / f"{daemon}.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def alive(self, daemon: str) -> bool:
        pid = self.pid(daemon)
        if pid is None or not process_running(pid):
            return False
        # a reused pid is not ours: the process must run the daemon binary
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip() == daemon[:15]
        except OSError:
            return False

    def version(self) -> str:
        return self.vsctl("get", "Open_vSwitch", ".", "ovs_version", check=False).strip('"') or "?"

    def stop(self, timeout: float = 5) -> None:
        for daemon in ("ovs-vswitchd", "ovsdb-server"):
            if self.alive(daemon):
                kill_and_wait(self.pid(daemon), timeout)


def kill_and_wait(pids: int | list[int], timeout: float = 5) -> None:
    """SIGTERM, then SIGKILL whatever is still running after timeout."""
    pids = [pids] if isinstance(pids, int) else list(pids)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(process_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in filter(process_running, pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def process_running(pid: int) -> bool:
    # daemons re-parented to a PID 1 that does not reap stay zombies: count those as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# The supervisor (fathom.lab.supervisor) of an instance leaves its pid and state in the run dir.
SUPERVISOR_MODULE = "fathom.lab.supervisor"


def supervisor_pid(rundir: Path) -> int | None:
    """The pid of the running supervisor of the instance in rundir, if there is one."""
    try:
        pid = int((Path(rundir) / "supervisor.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    if not process_running(pid):
        return None
    try:   # a reused pid is not ours: the process must be this instance's supervisor
        cmdline = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return None
    return pid if SUPERVISOR_MODULE in cmdline and str(rundir) in cmdline else None


def supervised_state(rundir: Path) -> dict | None:
    """What the supervisor last wrote (None without one), with whether it still runs."""
    try:
        state = json.loads((Path(rundir) / "supervisor.json").read_text())
    except (OSError, ValueError):
        return None
    state["running"] = supervisor_pid(rundir) is not None
    return state
