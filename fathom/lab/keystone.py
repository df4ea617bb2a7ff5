"""A real Keystone (OpenStack Identity, the PyPI release in the repo's .venv-neutron, built by
scripts/setup) for labs and tests: SQLite, Fernet tokens, served by gunicorn on loopback.

`KeystoneServer(dir).start()` runs keystone-manage's db_sync, fernet_setup, credential_setup and
bootstrap (an `admin` user in project `admin`, its password random) in one process, then serves
Keystone's WSGI app; `.admin_token()`, `.add_member(...)`, `.token(...)` and `.revoke(...)` speak
its identity API v3 as any client does.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path

import httpx

from .controller import free_port
from .neutron import VENV, stop_server, tail_logs

# keystone-manage's steps in one interpreter (each would import Keystone again as its own command)
MANAGE = """
import sys
from keystone.cmd import cli
conf, url = sys.argv[1:]
for step in (["db_sync"], ["fernet_setup", "--keystone-user", "root", "--keystone-group", "root"],
             ["credential_setup", "--keystone-user", "root", "--keystone-group", "root"],
             ["bootstrap", "--bootstrap-public-url", url]):     # the admin's password: OS_BOOTSTRAP_PASSWORD
    cli.CONF.clear()
    cli.main(argv=["keystone-manage", "--config-file", conf, *step])
"""
# the WSGI module gunicorn serves: Keystone's app reads its configuration from OS_KEYSTONE_CONFIG_*
# and parses sys.argv, which is gunicorn's
WSGI = """import sys
sys.argv = sys.argv[:1]
from keystone.wsgi.api import application
"""


def available() -> str | None:
    """Why a Keystone server cannot run here (None: it can)."""
    if not (VENV / "bin" / "keystone-manage").exists():
        return f"Keystone is missing from {VENV}: run scripts/setup"
    return None


class KeystoneServer:
    def __init__(self, workdir: Path, token_hours: float = 1.0):
        self.dir = Path(workdir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.password = secrets.token_urlsafe(16)        # the bootstrap admin's
        self.token_hours = token_hours
        self.proc: subprocess.Popen | None = None
        self.http = httpx.Client(base_url=self.url + "/v3", timeout=30)

    def start(self, timeout: float = 60) -> "KeystoneServer":
        self.dir.mkdir(parents=True, exist_ok=True)
        d = self.dir
        (d / "keystone.conf").write_text(f"""[DEFAULT]
log_dir = {d}
log_file = keystone.log
[database]
connection = sqlite:///{d}/keystone.db
[fernet_tokens]
key_repository = {d}/fernet-keys
[fernet_receipts]
key_repository = {d}/fernet-receipts
[credential]
key_repository = {d}/credential-keys
[token]
expiration = {int(self.token_hours * 3600)}
[identity]
# bcrypt's fewest rounds: every password check costs ~1 ms, not ~0.3 s (a test server)
password_hash_rounds = 4
""")
        (d / "keystone_wsgi.py").write_text(WSGI)
        env = {**os.environ, "OS_KEYSTONE_CONFIG_DIR": str(d), "OS_KEYSTONE_CONFIG_FILES": "keystone.conf",
               "PYTHONWARNINGS": "ignore"}
        made = subprocess.run([str(VENV / "bin" / "python"), "-c", MANAGE, str(d / "keystone.conf"), self.url + "/v3"],
                              env={**env, "OS_BOOTSTRAP_PASSWORD": self.password}, capture_output=True, text=True,
                              timeout=timeout)
        if made.returncode != 0:
            raise RuntimeError(f"keystone-manage failed ({made.returncode}):\n{made.stderr[-2000:]}\n{self.log_tail()}")
        log = open(d / "gunicorn.log", "ab")
        self.proc = subprocess.Popen(
            [str(VENV / "bin" / "gunicorn"), "--no-control-socket", "--workers", "1", "--timeout", "60",
             "--pid", str(d / "gunicorn.pid"), "--name", f"keystone {d}", "--graceful-timeout", "2",
             "--bind", f"127.0.0.1:{self.port}", "--pythonpath", str(d), "keystone_wsgi:application"],
            cwd=d, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"keystone exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if self.http.get("").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"keystone did not answer within {timeout} s:\n{self.log_tail()}")

    def token(self, user: str, password: str, project: str, domain: str = "Default") -> httpx.Response:
        """POST /v3/auth/tokens, password method, scoped to `project` (names in `domain`)."""
        return self.http.post("/auth/tokens", json={"auth": {
            "identity": {"methods": ["password"],
                         "password": {"user": {"name": user, "domain": {"name": domain}, "password": password}}},
            "scope": {"project": {"name": project, "domain": {"name": domain}}}}})

    def admin_token(self) -> str:
        r = self.token("admin", self.password, "admin")
        r.raise_for_status()
        return r.headers["X-Subject-Token"]

    def add_member(self, project: str, user: str, password: str, role: str = "member") -> str:
        """A project and a user with `role` in it; returns the project's id."""
        h = {"X-Auth-Token": self.admin_token()}

        def made(path: str, body: dict) -> dict:
            r = self.http.post(path, json=body, headers=h)
            r.raise_for_status()
            return r.json()
        project_id = made("/projects", {"project": {"name": project, "domain_id": "default"}})["project"]["id"]
        user_id = made("/users", {"user": {"name": user, "domain_id": "default", "password": password}})["user"]["id"]
        role_id = self.http.get("/roles", params={"name": role}, headers=h).json()["roles"][0]["id"]
        self.http.put(f"/projects/{project_id}/users/{user_id}/roles/{role_id}", headers=h).raise_for_status()
        return project_id

    def revoke(self, token: str) -> None:
        """DELETE /v3/auth/tokens: the token is refused from now on."""
        self.http.delete("/auth/tokens", headers={"X-Auth-Token": self.admin_token(),
                                                  "X-Subject-Token": token}).raise_for_status()

    def log_tail(self, lines: int = 40) -> str:
        return tail_logs(self.dir, ("gunicorn.log", "keystone.log"), lines)

    def stop(self) -> None:
        self.http.close()
        stop_server(self.proc)
