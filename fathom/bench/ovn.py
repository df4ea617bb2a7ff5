"""OVN on a lab, for `fathom bench ovn-compare`: the benchmark starts and stops every daemon itself.

On the host: the Northbound and Southbound databases (one `ovsdb-server` each) and `ovn-northd`. On
every lab node: one `ovn-controller` inside the node's namespace, against that node's own OVS (its
`db.sock`, and `br-int.mgmt` for OpenFlow), reaching the Southbound database over the lab's management
network, with Geneve tunnels between the nodes' `br-phy` addresses. The packaged services (Debian's
ovn-central / ovn-host units) are never used: every file of these daemons lives in `<lab dir>/ovn/`,
so `fathom lab down` finds and stops them even after a crash.

The tenant is written to the Northbound database with `ovn-nbctl`, as a CMS would, with every VM port
in the project's default security group as Neutron's OVN driver writes it (`add_security_group`):
a port group holding the ports, one stateful ACL per rule of the group (fathom's default rules,
`fathom.store.secgroups.DEFAULT_RULES`; a rule from the group's members matches the address set OVN
keeps for the port group), and the drop port group whose ACLs drop the rest. Whether a port is
up is read from `Logical_Switch_Port.up` by an `ovsdb-client monitor` (`UpMonitor`), which OVN sets
once the port's chassis has installed its flows (ovn-controller's if-status, acknowledged by a barrier).
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from fathom.lab.controller import free_port
from fathom.lab.lab import Lab
from fathom.lab.ovs import kill_and_wait, wait_for
from fathom.lab.sh import LabError, run
from fathom.store.secgroups import DEFAULT_RULES

NB_SCHEMA = "/usr/share/ovn/ovn-nb.ovsschema"
SB_SCHEMA = "/usr/share/ovn/ovn-sb.ovsschema"
SECURITY_GROUP = "pg_default"       # the project's default security group (Neutron: pg_<its id>)
DROP_GROUP = "neutron_pg_drop"      # Neutron's name: every port with port security is in it
PROGRAMS = ("ovn-northd", "ovn-controller", "ovn-nbctl", "ovn-sbctl", "ovsdb-server", "ovsdb-tool", "ovsdb-client")


class Ovn:
    """OVN's central daemons on the host and one ovn-controller per node of the lab `lab` (built
    standalone: br-int without a controller)."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.dir = lab.dir / "ovn"
        self.nb_sock = self.dir / "nb.sock"
        self.sb_sock = self.dir / "sb.sock"
        self.sb_remote: str | None = None

    # ------------------------------------------------------------------ daemons
    def _env(self, rundir: Path, ovs_rundir: Path | None = None) -> dict:
        env = {**os.environ, "OVN_RUNDIR": str(rundir), "OVN_LOGDIR": str(rundir), "OVN_DBDIR": str(rundir)}
        if ovs_rundir is not None:   # ovn-controller finds br-int.mgmt in OVS's run dir
            env["OVS_RUNDIR"] = str(ovs_rundir)
        return env

    def start(self) -> None:
        """Both databases, northd, and an ovn-controller on every node of the lab."""
        self.dir.mkdir(parents=True, exist_ok=True)
        root_ip = self.lab.state()["management"]["root_ip"]
        sb_port = free_port(root_ip)
        self.sb_remote = f"tcp:{root_ip}:{sb_port}"
        for name, schema, remotes in (("nb", NB_SCHEMA, []), ("sb", SB_SCHEMA, [f"--remote=ptcp:{sb_port}:{root_ip}"])):
            db = self.dir / f"{name}.db"
            if not db.exists():
                run(["ovsdb-tool", "create", str(db), schema])
            run(["ovsdb-server", str(db), f"--remote=punix:{self.dir / f'{name}.sock'}", *remotes,
                 f"--pidfile={self.dir / f'{name}.pid'}", f"--log-file={self.dir / f'{name}.log'}",
                 f"--unixctl={self.dir / f'{name}.ctl'}", "--detach"], env=self._env(self.dir))
        run(["ovn-nbctl", f"--db=unix:{self.nb_sock}", "--no-wait", "init"])
        run(["ovn-sbctl", f"--db=unix:{self.sb_sock}", "init"])
        run(["ovn-northd", f"--ovnnb-db=unix:{self.nb_sock}", f"--ovnsb-db=unix:{self.sb_sock}",
             f"--pidfile={self.dir / 'northd.pid'}", f"--log-file={self.dir / 'northd.log'}",
             f"--unixctl={self.dir / 'northd.ctl'}", "--detach"], env=self._env(self.dir))
        for node in self.lab.nodes():
            ovs = self.lab.ovs(node.name)
            # a chassis: its name, where the SB database is, its tunnel endpoint (br-phy's address)
            ovs.vsctl("set", "open_vswitch", ".", f"external_ids:system-id={self.lab.name}-{node.name}",
                      f"external_ids:ovn-remote={self.sb_remote}", "external_ids:ovn-encap-type=geneve",
                      f"external_ids:ovn-encap-ip={node.tunnel_ip}", "external_ids:ovn-bridge=br-int",
                      "external_ids:ovn-bridge-datapath-type=netdev",
                      "--", "set", "bridge", "br-int", "fail_mode=secure")
            rundir = self.dir / node.name
            rundir.mkdir(exist_ok=True)
            run(["ovn-controller", f"unix:{ovs.db_sock}", f"--pidfile={rundir / 'ovn-controller.pid'}",
                 f"--log-file={rundir / 'ovn-controller.log'}", "--detach"], ns=node.netns, env=self._env(rundir, ovs.rundir))
        want = len(self.lab.nodes())
        wait_for(lambda: len(self.sbctl("--bare", "--columns=name", "list", "chassis").split()) == want, 30,
                 f"{want} OVN chassis registered in the Southbound database")

    def pids(self) -> dict[str, int]:
        """The control plane's processes: name -> pid (nb, sb, northd, ovn-controller-<node>)."""
        out = {}
        for name in ("nb", "sb", "northd"):
            pid = _pid(self.dir / f"{name}.pid")
            if pid:
                out[{"nb": "ovsdb-server-nb", "sb": "ovsdb-server-sb", "northd": "ovn-northd"}[name]] = pid
        for node in self.lab.nodes():
            pid = _pid(self.dir / node.name / "ovn-controller.pid")
            if pid:
                out[f"ovn-controller-{node.name}"] = pid
        return out

    def stop(self) -> None:
        kill_and_wait(list(self.pids().values()), timeout=5)

    # ------------------------------------------------------------------ tools
    def nbctl(self, *args: str, timeout: float = 30) -> str:
        return run(["ovn-nbctl", f"--db=unix:{self.nb_sock}", "--timeout=20", *args], timeout=timeout).stdout.strip()

    def sbctl(self, *args: str) -> str:
        return run(["ovn-sbctl", f"--db=unix:{self.sb_sock}", "--timeout=20", *args], check=False).stdout.strip()

    # ------------------------------------------------------------------ the tenant
    def add_switch(self, name: str) -> None:
        self.nbctl("ls-add", name)

    def add_router(self, name: str, interfaces: dict[str, tuple[str, str]]) -> None:
        """A distributed logical router with one interface per switch: {switch: (mac, ip/prefix)}."""
        cmd = ["lr-add", name]
        for switch, (mac, cidr) in interfaces.items():
            lrp, lsp = f"{name}-{switch}", f"{switch}-{name}"
            cmd += ["--", "lrp-add", name, lrp, mac, cidr,
                    "--", "lsp-add", switch, lsp, "--", "lsp-set-type", lsp, "router",
                    "--", "lsp-set-addresses", lsp, "router", "--", "lsp-set-options", lsp, f"router-port={lrp}"]
        self.nbctl(*cmd)

    def add_security_group(self) -> None:
        """The project's default security group as Neutron's OVN driver writes it: port group
        `SECURITY_GROUP` with one allow-related ACL per rule (priority 1002), and `DROP_GROUP`, whose
        ACLs (priority 1001) drop every other IP packet to or from its ports."""
        pg, drop = SECURITY_GROUP, DROP_GROUP
        cmd = ["pg-add", drop, "--", "pg-add", pg]
        for direction, match in (("from-lport", f"inport == @{drop} && ip"), ("to-lport", f"outport == @{drop} && ip")):
            cmd += ["--", "--type=port-group", "acl-add", drop, direction, "1001", match, "drop"]
        for direction, ethertype, from_members in DEFAULT_RULES:
            ip = "ip4" if ethertype == "IPv4" else "ip6"
            if direction == "egress":
                lport, match = "from-lport", f"inport == @{pg} && {ip}"
            else:
                lport, match = "to-lport", f"outport == @{pg} && {ip}"
                if from_members:
                    match += f" && {ip}.src == ${pg}_{ip}"
            cmd += ["--", "--type=port-group", "acl-add", pg, lport, "1002", match, "allow-related"]
        self.nbctl(*cmd)

    @staticmethod
    def port_commands(switch: str, name: str, mac: str, ip: str) -> list[str]:
        """ovn-nbctl arguments adding a VM port as Neutron's OVN driver does: addresses and port
        security both 'MAC IP', a member of the default security group's and the drop port groups
        (`add_security_group`), all in the transaction that creates it."""
        ref = f"@{name.replace('-', '_')}"
        return ["--", f"--id={ref}", "create", "Logical_Switch_Port", f"name={name}",
                f'addresses="{mac} {ip}"', f'port_security="{mac} {ip}"',
                "--", "add", "Logical_Switch", switch, "ports", ref,
                "--", "add", "Port_Group", SECURITY_GROUP, "ports", ref,
                "--", "add", "Port_Group", DROP_GROUP, "ports", ref]

    def add_port(self, switch: str, name: str, mac: str, ip: str) -> None:
        self.nbctl(*self.port_commands(switch, name, mac, ip)[1:])

    def add_ports(self, switch: str, ports: list[tuple[str, str, str]]) -> None:
        """Many ports in one transaction: [(name, mac, ip)]."""
        cmd: list[str] = []
        for name, mac, ip in ports:
            cmd += self.port_commands(switch, name, mac, ip)
        if cmd:
            self.nbctl(*cmd[1:], timeout=120)

    def delete_port(self, name: str) -> None:
        self.nbctl("--if-exists", "lsp-del", name)

    def delete_ports(self, names: list[str]) -> None:
        cmd: list[str] = []
        for name in names:
            cmd += ["--", "--if-exists", "lsp-del", name]
        if cmd:
            self.nbctl(*cmd[1:], timeout=120)


def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


class UpMonitor:
    """`Logical_Switch_Port.up` as OVN's Northbound database reports it, pushed by an
    `ovsdb-client monitor` (no polling): for each port, when it was last seen turning up."""

    def __init__(self, ovn: Ovn):
        self.proc = subprocess.Popen(
            ["ovsdb-client", "monitor", f"unix:{ovn.nb_sock}", "OVN_Northbound", "Logical_Switch_Port",
             "name,up", "--format=json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.lock = threading.Condition()
        self.up: dict[str, bool] = {}
        self.up_at: dict[str, float] = {}      # time.time() when the update saying up=true arrived
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            now = time.time()
            try:
                update = json.loads(line)
            except ValueError:
                continue
            cols = update.get("headings", [])
            if "name" not in cols or "up" not in cols:
                continue
            with self.lock:
                for row in update.get("data", []):
                    cells = dict(zip(cols, row))
                    name, up = cells["name"], cells["up"]
                    # `up` is an optional boolean: ["set", []] when absent, else true/false
                    is_up = up is True
                    if cells.get("action") == "delete":
                        is_up = False
                    if is_up and not self.up.get(name):
                        self.up_at[name] = now
                    self.up[name] = is_up
                self.lock.notify_all()

    def forget(self, name: str) -> None:
        with self.lock:
            self.up_at.pop(name, None)

    def wait_up(self, name: str, timeout: float) -> float | None:
        """time.time() at which `name` was reported up, or None after `timeout` s."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while name not in self.up_at:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.lock.wait(left)
            return self.up_at[name]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def require() -> None:
    from fathom import programs
    try:
        programs.require(*PROGRAMS)
    except programs.ProgramMissing as e:
        raise LabError(str(e)) from None
