"""The lab host's service manager: keeps one OVS instance's daemons running, as systemd does on a
real host for Debian's `ovsdb-server` and `ovs-vswitchd` units (Type=forking, Restart=on-failure).

One supervisor process per OVS instance (every node and the fabric switch), started detached by
`fathom lab up` so that it outlives the command that built the lab. In the instance's run dir:
`supervisor.pid`, `supervisor.json` (each daemon's pid, state and restart count, read by
`fathom lab status`) and `supervisor.log`. `fathom lab down` stops it first: on SIGTERM it stops
its daemons and exits.

- It is the daemons' subreaper (PR_SET_CHILD_SUBREAPER): started with `--detach` like a
  Type=forking unit, they are re-parented to it, so it learns at once how each one ended.
- Restart=on-failure: a daemon that exits non-zero or dies of a signal other than SIGTERM, SIGINT,
  SIGHUP or SIGPIPE is started again after 0.1 s (systemd's default RestartSec), the delay
  doubling with each consecutive failure up to 10 s and back to 0.1 s once it has run 10 s. A clean
  stop (exit 0, SIGTERM) stays stopped until started.
- Ordering: ovs-vswitchd is started only while ovsdb-server runs (it needs the database to start).
- SIGUSR1 is `systemctl start`: start every stopped daemon now (OvsInstance.start_vswitchd sends it).
- The node's agent (`fathom agent run`, deploy/systemd/fathom-agent.service on a real host) is a
  third unit once the lab has written its command line to `agent.json` in the run dir (the lab does
  so once the controller knows the node and has issued its agent token) and sent SIGUSR1. It runs
  in the node's network namespace (and the machine's mount namespace, as on a real host), needs ovsdb-server (After=openvswitch-switch), logs to `agent.log`,
  and is stopped first. Like systemd's KillMode=process, stopping or restarting it signals only the
  agent itself: the PPTMon loaders it started keep their programs attached.
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .ovs import SUPERVISOR_MODULE, OvsInstance, supervised_state, supervisor_pid, wait_for
from .sh import LabError

DAEMONS = ("ovsdb-server", "ovs-vswitchd")   # start order; stopped in reverse
AGENT = "fathom-agent"
AGENT_CONFIG = "agent.json"                   # {"argv": [...]}: the agent's command line
FIRST_DELAY, MAX_DELAY, STABLE_AFTER = 0.1, 10.0, 10.0
CLEAN_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE}
PR_SET_CHILD_SUBREAPER = 36
MODULE = SUPERVISOR_MODULE


@dataclass
class Unit:
    name: str
    state: str = "stopped"          # running | restarting | stopped
    pid: int | None = None
    restarts: int = 0               # automatic restarts after failures (systemd's NRestarts)
    failures: int = 0               # consecutive: sets the next delay
    last_exit: str | None = None    # "killed by SIGKILL", "exited 1", ...
    started: float | None = None    # wall clock of the last start
    due: float | None = None        # monotonic time of the next restart attempt

    def delay(self) -> float:
        return min(MAX_DELAY, FIRST_DELAY * 2 ** max(0, self.failures - 1))


def describe(status: int) -> tuple[str, bool]:
    """(what happened, whether it counts as a failure) for a waitpid status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        return f"killed by {name}", sig not in CLEAN_SIGNALS
    code = os.WEXITSTATUS(status)
    return f"exited {code}", code != 0


class Supervisor:
    def __init__(self, ovs: OvsInstance):
        self.ovs = ovs
        self.units = {name: Unit(name) for name in DAEMONS}
        self.order = list(DAEMONS)
        self.by_pid: dict[int, Unit] = {}
        self.stopping = False
        self.start_requested = False

    # ----- process
    def run(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGUSR1, self._on_start)
        pidfile = self.ovs.rundir / "supervisor.pid"
        pidfile.write_text(str(os.getpid()))
        # first boot: any failure ends the supervisor, and `lab up` shows its log
        self.ovs.create_db()
        self.started("ovsdb-server", self.ovs.spawn("ovsdb-server"))
        self.ovs.init_db()
        self.started("ovs-vswitchd", self.ovs.spawn("ovs-vswitchd"))
        self.load_agent()
        while not self.stopping:
            try:
                self.reap()
                if self.start_requested:
                    self.start_requested = False
                    self.load_agent()
                    for u in self.units.values():
                        if u.state != "running":
                            u.due = time.monotonic()
                self.start_due()
                self.save()
            except Exception as e:  # noqa: BLE001 - the supervisor must outlive a bad moment
                self.log(f"supervisor: {type(e).__name__}: {e}")
                time.sleep(1)
            dues = [u.due for u in self.units.values() if u.due is not None and self.startable(u.name)]
            timeout = max(0.0, min(dues) - time.monotonic()) if dues else None
            try:
                if select.select([wake_r], [], [], timeout)[0]:
                    os.read(wake_r, 512)
            except InterruptedError:
                pass
        self.shutdown()
        pidfile.unlink(missing_ok=True)

    def _on_stop(self, *_):
        self.stopping = True

    def _on_start(self, *_):
        self.start_requested = True

    def log(self, msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {self.ovs.netns}: {msg}", flush=True)

    # ----- units
    def startable(self, name: str) -> bool:
        """ovs-vswitchd and the agent need the database to start (the units' After=ovsdb-server)."""
        return name == "ovsdb-server" or self.units["ovsdb-server"].state == "running"

    def load_agent(self) -> None:
        """The agent unit, once the lab has configured it."""
        if AGENT not in self.units and (self.ovs.rundir / AGENT_CONFIG).exists():
            self.units[AGENT] = Unit(AGENT, state="restarting", due=time.monotonic())
            self.order.append(AGENT)

    def spawn(self, name: str) -> int:
        if name != AGENT:
            return self.ovs.spawn(name)
        argv = json.loads((self.ovs.rundir / AGENT_CONFIG).read_text())["argv"]
        log = open(self.ovs.rundir / "agent.log", "ab")
        try:
            # the node's network namespace only (not `ip netns exec`, which also gives the process a
            # mount namespace of its own): like an agent on a real host it shares the machine's
            # mounts, so the router namespaces it adds under /run/netns outlive it and are seen by all
            proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{self.ovs.netns}", "--", *argv],
                                    stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        finally:
            log.close()
        proc.returncode = 0   # reaped by reap(), not by the Popen object
        return proc.pid

    def started(self, name: str, pid: int | None) -> None:
        u = self.units[name]
        u.state, u.pid, u.started, u.due = "running", pid, time.time(), None
        if pid is not None:
            self.by_pid[pid] = u
        self.log(f"{name}: running as pid {pid}")

    def start(self, name: str) -> None:
        u = self.units[name]
        try:
            pid = self.spawn(name)
        except (LabError, OSError, ValueError, KeyError) as e:
            u.failures += 1
            u.state, u.due, u.last_exit = "restarting", time.monotonic() + u.delay(), f"start failed: {e}"
            self.log(f"{name}: start failed, next try in {u.delay():.1f} s: {e}")
            return
        self.started(name, pid)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            u = self.by_pid.pop(pid, None)
            if u is None or u.pid != pid:
                continue                      # an orphan of some tool run in the namespace
            what, failed = describe(status)
            u.pid, u.last_exit = None, what
            if self.stopping or not failed:
                u.state, u.failures = "stopped", 0
                self.log(f"{u.name}: {what}; stopped")
                continue
            if u.started is not None and time.time() - u.started >= STABLE_AFTER:
                u.failures = 0
            u.failures += 1
            u.restarts += 1
            u.state, u.due = "restarting", time.monotonic() + u.delay()
            self.log(f"{u.name}: {what}; restart {u.restarts} in {u.delay():.1f} s")

    def start_due(self) -> None:
        now = time.monotonic()
        for name in self.order:       # the database first, then what needs it
            u = self.units[name]
            if u.due is not None and u.due <= now and self.startable(name):
                self.start(name)

    def save(self) -> None:
        path = self.ovs.rundir / "supervisor.json"
        tmp = path.with_suffix(".tmp")
        units = {n: {k: v for k, v in asdict(u).items() if k not in ("name", "due", "failures")}
                 for n, u in self.units.items()}
        tmp.write_text(json.dumps({"pid": os.getpid(), "units": units}, indent=2))
        tmp.replace(path)

    def shutdown(self) -> None:
        """Stop the daemons (switch first), SIGKILL what is left after 5 s."""
        self.stopping = True
        for name in reversed(self.order):
            u = self.units[name]
            if u.pid is None:
                continue
            try:
                os.kill(u.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 5
            while u.pid is not None and time.monotonic() < deadline:
                self.reap()
                time.sleep(0.02)
            if u.pid is not None:
                try:
                    os.kill(u.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                time.sleep(0.05)
                self.reap()
        self.save()


# ----------------------------------------------------------------------------- used by the lab

def start_supervised(ovs: OvsInstance, timeout: float = 30) -> int:
    """Start a supervisor for `ovs` (which starts both daemons); returns its pid once both run."""
    ovs.rundir.mkdir(parents=True, exist_ok=True)
    log = open(ovs.rundir / "supervisor.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", MODULE, ovs.netns, str(ovs.rundir)], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    log.close()

    def ready():
        if proc.poll() is not None:
            tail = (ovs.rundir / "supervisor.log").read_text(errors="replace").splitlines()[-10:]
            raise LabError(f"the OVS supervisor of {ovs.netns} exited ({proc.returncode}):\n" + "\n".join(tail))
        st = supervised_state(ovs.rundir)
        return st is not None and all(st["units"][d]["state"] == "running" for d in DAEMONS)
    wait_for(ready, timeout, f"Open vSwitch in {ovs.netns} (see {ovs.rundir / 'supervisor.log'})")
    return proc.pid


def stop_supervised(rundir: Path, timeout: float = 10) -> bool:
    """Stop the supervisor of rundir and, through it, its daemons; False if none was running."""
    from .ovs import kill_and_wait
    pid = supervisor_pid(rundir)
    if pid is None:
        return False
    kill_and_wait(pid, timeout)
    return True


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        sys.exit("usage: python -m fathom.lab.supervisor NETNS RUNDIR")
    Supervisor(OvsInstance(argv[0], argv[1])).run()


if __name__ == "__main__":
    main(sys.argv[1:])
