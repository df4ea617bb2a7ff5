"""What the measurements of `fathom bench scale` share: a `fathom controller` process of their own
(`Controller`) and ports created by concurrent clients (`create_parallel`)."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fathom.bench import procs
from fathom.client import ApiError, Client
from fathom.lab.controller import free_port

RUN_ROOT = Path("/run/fathom-bench")
START_TIMEOUT_S = 180     # a controller's start on a crowded two-core machine can take a minute


def hold_run_dir(run_dir: Path):
    """Take `run_dir` for this process until the returned file is closed (or the process ends): two
    benchmarks given the same run directory (the same `--lab`) would stop each other's controllers
    and delete each other's stores, so the second is refused, naming the first's process."""
    run_dir.mkdir(parents=True, exist_ok=True)
    held = open(run_dir / "owner", "a+")
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.seek(0)
        owner = held.read().strip() or "another process"
        held.close()
        raise RuntimeError(f"{run_dir} is in use by process {owner} (another benchmark with the same lab "
                           "name): give this one another --lab") from None
    held.truncate(0)
    held.write(str(os.getpid()))
    held.flush()
    return held


@dataclass
class Controller:
    """A `fathom controller` process of this benchmark: its store, state and log in `run_dir`."""
    run_dir: Path
    db_url: str
    of_host: str = "127.0.0.1"
    interval: float = 5.0
    api_workers: int = 1
    cluster: bool = False                   # a replica (`--cluster`; PostgreSQL only)
    proc: subprocess.Popen | None = None
    api: Client | None = None
    api_port: int = 0                       # chosen at the first start, kept by a restart
    of_port: int = 0

    def start(self) -> "Controller":
        from fathom.auth.client import read_token_file
        from fathom.auth.tokens import ADMIN_TOKEN_FILE
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self.api_port:
            self.api_port, self.of_port = free_port(), free_port(self.of_host)
        fathom = Path(sys.executable).with_name("fathom")
        cmd = [str(fathom), "controller", "--db", self.db_url, "--api-port", str(self.api_port),
               "--of-host", self.of_host, "--of-port", str(self.of_port), "--interval", str(self.interval),
               "--state-dir", str(self.run_dir), "--insecure",
               *(["--api-workers", str(self.api_workers)] if self.api_workers > 1 else []),
               *(["--cluster"] if self.cluster else [])]
        log = open(self.run_dir / "controller.log", "a")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.api_port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the controller exited ({self.proc.returncode}); see {self.run_dir}/controller.log")
            try:
                self.token = read_token_file(self.run_dir / ADMIN_TOKEN_FILE)
                probe = Client(self.url, token=self.token, timeout=2)
                probe.health()
                probe.close()
                self.api = self.client(timeout=300)
                return self
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the controller did not answer on {self.url} within {START_TIMEOUT_S} s")

    def client(self, timeout: float = 60) -> Client:
        return Client(self.url, token=self.token, timeout=timeout)

    def cpu(self) -> float:
        """CPU seconds of the controller and its API workers."""
        return sum(procs.cpu_seconds(p) or 0.0 for p in (self.proc.pid, *procs.children(self.proc.pid)))

    def stop(self) -> None:
        if self.api is not None:
            self.api.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def all_active(api: Client, timeout: float = 300) -> None:
    """Every port `active` within `timeout` s; RuntimeError naming the first that is not. A port in
    `error` is waited on further: a node whose OVSDB call timed out on a loaded host is retried by
    the controller's next check, and its ports come up then."""
    deadline = time.monotonic() + timeout
    for p in api.list("/ports"):
        while p["status"] != "active" and time.monotonic() < deadline:
            p = api.wait_status("ports", p["id"], timeout=max(0.1, deadline - time.monotonic()))
            if p["status"] == "error":
                time.sleep(0.5)
        if p["status"] != "active":
            raise RuntimeError(f"port {p['id']}: {p['status']} ({p.get('status_reason')}) after {timeout:g} s")


def create_parallel(ctl, bodies: list[dict], writers: int = 8, path: str = "/ports") -> list[dict]:
    """Create ports (or the objects of another collection, `path`) with `writers` concurrent
    clients of `ctl.client()` (filling a fabric quickly); raises on any error."""
    out: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()

    def work(part: list[dict]) -> None:
        client = ctl.client()
        try:
            for body in part:
                try:
                    port = client.post(path, json=body)
                    with lock:
                        out.append(port)
                except ApiError as e:
                    errors.append(str(e))
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(bodies[w::writers],), daemon=True) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} creations ({path}) failed, e.g. {errors[0]}")
    return out
