"""A real Neutron API server for labs (the lab tests and `make demo-openstack`): the PyPI release in
the repo's .venv-neutron (built by scripts/setup), ML2 with fathom's mechanism driver, the stock L3
plugin with fathom's flavor providers, TaaS and networking-sfc with fathom's drivers, on SQLite,
served by gunicorn (sync workers, one unless told), no Keystone (noauth) and no broker.

And `Sdk`, openstacksdk driven from this (fathom's) interpreter: a helper process in Neutron's
environment answers one JSON line per call (openstacksdk's proxies by name, e.g.
`network.create_network`), so callers use the real SDK without importing its libraries here.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx

from .controller import free_port

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-neutron"
TOOLS = REPO / "networking-fathom" / "tools"
# Neutron's schema is made once per version of the driver's tables, then copied for every server
SCHEMA_CACHE = VENV / ("fathom-sqlite-schema-" + hashlib.sha256(
    (REPO / "networking-fathom" / "networking_fathom" / "db.py").read_bytes()
    + (TOOLS / "sqlite_schema.py").read_bytes()).hexdigest()[:12] + ".db")
# the provider router's MAC on external networks ([fathom] upstream_mac): Neutron does not know it
UPSTREAM_MAC = "02:fe:00:00:00:01"
# a lab for a Neutron cloud: the nodes its ports bind to (binding:host_id), no VM of its own (VMs are
# plugged for Neutron's ports: fathom.lab.plug); docs/openstack.md brings it up from the file
TOPOLOGY_FILE = Path(__file__).parent / "topologies" / "neutron.yaml"
TOPOLOGY = TOPOLOGY_FILE.read_text()


def available() -> str | None:
    """Why a Neutron server cannot run here (None: it can)."""
    if not (VENV / "bin" / "gunicorn").exists():
        return f"{VENV} is missing: run scripts/setup"
    return None


def neutron_conf(workdir: Path, port: int, fathom_url: str, token_file: Path, sync_interval: float,
                 upstream_mac: str) -> str:
    return f"""[DEFAULT]
core_plugin = ml2
service_plugins = router,flavors,taas,sfc,flow_classifier
auth_strategy = noauth
transport_url = fake://
state_path = {workdir}
log_dir = {workdir}
log_file = neutron.log
api_paste_config = {VENV}/etc/neutron/api-paste.ini
bind_port = {port}
debug = false
[database]
connection = sqlite:///{workdir}/neutron.db
[service_providers]
service_provider = L3_ROUTER_NAT:fathom:networking_fathom.l3.Distributed:default
service_provider = L3_ROUTER_NAT:fathom_fabric:networking_fathom.l3.Fabric
service_provider = L3_ROUTER_NAT:fathom_network_node:networking_fathom.l3.NetworkNode
service_provider = TAAS:fathom:networking_fathom.taas.FathomTaasDriver:default
[fathom]
url = {fathom_url}
token_file = {token_file}
sync_interval = {sync_interval}
retry_interval = 0.5
upstream_mac = {upstream_mac}
[sfc]
drivers = fathom
[flowclassifier]
drivers = fathom
"""


ML2_CONF = """[ml2]
type_drivers = flat,vlan,vxlan
tenant_network_types = vxlan
mechanism_drivers = fathom
extension_drivers = port_security
[ml2_type_vxlan]
vni_ranges = 1000:1999
[ml2_type_vlan]
network_vlan_ranges = physnet1:100:999
[ml2_type_flat]
flat_networks = physnet1
"""


class NeutronServer:
    def __init__(self, workdir: Path, fathom_url: str, token: str, sync_interval: float = 5.0,
                 upstream_mac: str = UPSTREAM_MAC, workers: int = 1):
        self.dir = Path(workdir)
        self.workers = workers          # gunicorn's: API worker processes, each with its journal thread
        self.upstream_mac = upstream_mac
        self.fathom_url, self.token, self.sync_interval = fathom_url, token, sync_interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> "NeutronServer":
        self.dir.mkdir(parents=True, exist_ok=True)
        token_file = self.dir / "fathom-token"
        token_file.write_text(self.token)
        token_file.chmod(0o600)
        (self.dir / "neutron.conf").write_text(neutron_conf(self.dir, self.port, self.fathom_url, token_file,
                                                            self.sync_interval, self.upstream_mac))
        (self.dir / "ml2_conf.ini").write_text(ML2_CONF)
        db = self.dir / "neutron.db"
        if not db.exists():
            if not SCHEMA_CACHE.exists():
                tmp = SCHEMA_CACHE.with_suffix(".tmp")
                tmp.unlink(missing_ok=True)
                subprocess.run([str(VENV / "bin/python"), str(TOOLS / "sqlite_schema.py"), str(tmp),
                                str(self.dir / "neutron.conf"), str(self.dir / "ml2_conf.ini")],
                               check=True, capture_output=True, text=True)
                tmp.replace(SCHEMA_CACHE)
            shutil.copy(SCHEMA_CACHE, db)
        env = {**os.environ, "OS_NEUTRON_CONFIG_DIR": str(self.dir),
               "OS_NEUTRON_CONFIG_FILES": "neutron.conf;ml2_conf.ini", "PYTHONWARNINGS": "ignore"}
        log = open(self.dir / "gunicorn.log", "ab")
        self.proc = subprocess.Popen(
            # a lab that holds the server's run dir stops it on `fathom lab down`: the pid file is
            # there, and the process title (gunicorn rewrites its command line) names the run dir
            [str(VENV / "bin" / "gunicorn"), "--no-control-socket", "--workers", str(self.workers), "--timeout", "120",
             "--pid", str(self.dir / "gunicorn.pid"), "--name", f"neutron {self.dir}", "--graceful-timeout", "2",
             "--bind", f"127.0.0.1:{self.port}", "--pythonpath", str(TOOLS), "wsgi:application"],
            cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"neutron exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/v2.0/networks", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"neutron did not answer within {timeout} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return tail_logs(self.dir, ("gunicorn.log", "neutron.log"), lines)

    def log(self) -> str:
        f = self.dir / "neutron.log"
        return f.read_text(errors="replace") if f.exists() else ""

    def stop(self) -> None:
        stop_server(self.proc)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """The `openstack` command line against this server (-f json where it prints)."""
        env = {**os.environ, "OS_AUTH_TYPE": "none", "OS_ENDPOINT": self.url, "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run([str(VENV / "bin" / "openstack"), *args], env=env, capture_output=True, text=True,
                              timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"openstack {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc


def tail_logs(directory: Path, names: tuple[str, ...], lines: int = 40) -> str:
    """The last `lines` of each of a server's log files that exists."""
    out = []
    for name in names:
        f = directory / name
        if f.exists():
            out += [f"--- {name}"] + f.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(out)


def stop_server(proc: subprocess.Popen | None) -> None:
    """SIGTERM to a server's process group (gunicorn and its workers), SIGKILL after 10 s."""
    if proc and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


class Sdk:
    """openstacksdk, in Neutron's environment, one JSON line per call:
    `sdk.call("network.create_network", name="blue")` -> the resource as a dict."""

    HELPER = """
import json, sys, warnings
warnings.simplefilter("ignore")
import openstack
conn = openstack.connect(auth_type="none", auth={"endpoint": sys.argv[1]})
for line in sys.stdin:
    req = json.loads(line)
    try:
        target = conn
        for part in req["call"].split("."):
            target = getattr(target, part)
        out = target(*req.get("args", []), **req.get("kwargs", {}))
        if out is not None and not isinstance(out, (dict, list, str, int, bool)):
            out = [o.to_dict() for o in out] if not hasattr(out, "to_dict") else out.to_dict()
        print(json.dumps({"ok": out}, default=str), flush=True)
    except Exception as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
"""

    def __init__(self, url: str):
        self.proc = subprocess.Popen([str(VENV / "bin/python"), "-c", self.HELPER, url], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})

    def call(self, method: str, *args, **kwargs):
        self.proc.stdin.write(json.dumps({"call": method, "args": list(args), "kwargs": kwargs}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        if "error" in answer:
            raise SdkError(f"{method}: {answer['error']}")
        return answer["ok"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


class SdkError(Exception):
    pass
