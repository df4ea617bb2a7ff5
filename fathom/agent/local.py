"""The host the agent runs on: its Open vSwitch (over the local OVSDB socket), its links, its facts.

Everything here runs on the node itself, in the network namespace the agent was started in (the
host's own on a real machine, the node's namespace in the lab).
"""
from __future__ import annotations

import json
import logging
import os
import platform
import re
import socket
from pathlib import Path

from fathom.host.exec import CommandError, run

LOG = logging.getLogger("fathom.agent")
DEFAULT_OVSDB = "unix:/var/run/openvswitch/db.sock"


class LocalOvs:
    """This node's OVS through ovs-vsctl on its local database socket."""

    def __init__(self, db: str = DEFAULT_OVSDB):
        self.db = db

    def vsctl(self, *args: str, check: bool = True) -> str:
        return run(["ovs-vsctl", f"--db={self.db}", "--timeout=10", *args], check=check).stdout.strip()

    def ports(self, bridge: str = "br-int") -> set[str]:
        return set(self.vsctl("list-ports", bridge, check=False).split())

    def add_port(self, bridge: str, port: str) -> None:
        self.vsctl("--may-exist", "add-port", bridge, port)

    def del_port(self, bridge: str, port: str) -> None:
        self.vsctl("--if-exists", "del-port", bridge, port)

    def appctl(self, *args: str) -> str:
        """ovs-appctl to this node's ovs-vswitchd, whose control socket lies beside the database's."""
        env = {"OVS_RUNDIR": str(Path(self.db[len("unix:"):]).parent)} if self.db.startswith("unix:") else None
        return run(["ovs-appctl", "--timeout=10", "-t", "ovs-vswitchd", *args], env=env).stdout.strip()


def links(ns: str | None = None, details: bool = False) -> list[dict]:
    """`ip -j link` of this namespace (or `ns`); `details`: with each link's kind (veth, ...)."""
    out = run(["ip", *(["-d"] if details else []), "-j", "link", "show"], ns, check=False).stdout
    try:
        return json.loads(out or "[]")
    except ValueError:
        return []


def namespaces() -> set[str]:
    out = run(["ip", "-j", "netns", "list"], check=False).stdout.strip()
    try:
        return {e["name"] for e in json.loads(out)} if out else set()
    except ValueError:
        return set()


def _ovs_list(text: str) -> list[str]:
    """An OVSDB set as ovs-vsctl prints it: `[netdev, system]`."""
    return [x.strip().strip('"') for x in text.strip().strip("[]").split(",") if x.strip()]


def facts(ovs: LocalOvs) -> dict:
    """What the controller needs to know about this host (fathom.api.agents.Facts)."""
    from fathom import __version__
    from fathom.pptmon import native
    out: dict = {"hostname": socket.gethostname()[:255], "kernel": f"{platform.system()} {platform.release()}"[:255],
                 "agent_version": __version__, "ovs_kernel_module": Path("/sys/module/openvswitch").exists()}
    try:
        out["ovs_version"] = ovs.vsctl("get", "Open_vSwitch", ".", "ovs_version").strip('"')[:64] or None
        out["datapath_types"] = _ovs_list(ovs.vsctl("get", "Open_vSwitch", ".", "datapath_types"))[:16]
    except CommandError:
        out["ovs_version"], out["datapath_types"] = None, []
    out["ebpf"] = {"btf": Path("/sys/kernel/btf/vmlinux").exists(),
                   "bpffs": Path("/sys/fs/bpf").exists(),
                   "jit": _read("/proc/sys/net/core/bpf_jit_enable") in ("1", "2"),
                   "pptmon_loader": native.LOADER.exists()}
    out["interfaces"] = [{"name": link["ifname"][:15], "mac": link.get("address") if len(link.get("address") or "") == 17
                          else None, "up": "UP" in link.get("flags", []),
                          "kind": (link.get("linkinfo") or {}).get("info_kind")}
                         for link in links(details=True)[:4096]]
    return out


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (OSError, TypeError):
        return False
    try:   # a zombie is gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def ipv4_addresses(ns: str | None, dev: str) -> set:
    """The IPv4 addresses (ipaddress.IPv4Interface) of `dev` in namespace `ns` (None: this one)."""
    import ipaddress
    out = run(["ip", "-j", "-4", "addr", "show", "dev", dev], ns, check=False).stdout
    try:
        return {ipaddress.IPv4Interface(f"{a['local']}/{a['prefixlen']}")
                for link in json.loads(out or "[]") for a in link.get("addr_info", [])}
    except (ValueError, KeyError):
        return set()


def set_ipv4_addresses(ns: str | None, dev: str, want: set) -> list[str]:
    """Make `dev`'s IPv4 addresses exactly `want` (ipaddress.IPv4Interface); what was added."""
    have = ipv4_addresses(ns, dev)
    for addr in have - want:
        run(["ip", "addr", "del", str(addr), "dev", dev], ns, check=False)
    for addr in sorted(want - have, key=str):
        run(["ip", "addr", "add", str(addr), "dev", dev], ns)
    return [f"{dev} address {addr}" for addr in sorted(want - have, key=str)]


def bring_up_veth(ends) -> None:
    """Bring up each (namespace, device, its `ip -j link` entry) not yet up, TX checksum offload off
    first: OVS's netdev datapath reads veths through AF_PACKET, which sees packets before their
    checksums are filled in."""
    for ns, dev, link in ends:
        if "UP" not in link.get("flags", []):
            run(["ethtool", "-K", dev, "tx", "off"], ns, check=False)
            run(["ip", "link", "set", dev, "up"], ns)


class NamespaceObjects:
    """A handler whose objects are one network namespace each, `<prefix><key>` (a router's, a
    network's DHCP server's): `apply` makes the host hold exactly the objects given, creating or
    repairing each (`ensure`, the subclass's) and removing the namespaces of keys no longer wanted
    (`remove`). Subclasses set KIND and LABEL (for the log) and `key(obj)`."""
    KIND = ""
    LABEL = ""

    def __init__(self, ovs: LocalOvs, prefix: str):
        self.ovs = ovs
        self.prefix = prefix
        self._ns_re = re.compile(rf"^{re.escape(prefix)}(\d+)$")

    def namespace(self, key: int) -> str:
        return f"{self.prefix}{key}"

    def held(self) -> set[int]:
        """Keys of the namespaces this agent holds."""
        return {int(m.group(1)) for ns in namespaces() if (m := self._ns_re.match(ns))}

    def key(self, obj) -> int:
        raise NotImplementedError

    def ensure(self, obj) -> list[str]:
        """Make the host hold `obj`; what was changed (empty: it was right)."""
        raise NotImplementedError

    def remove(self, key: int) -> None:
        raise NotImplementedError

    def apply(self, objects: list) -> dict[str, dict]:
        """Make this node hold exactly `objects`; the status of each, by owner key."""
        from fathom.model.hostlocal import digest, owner_key
        out = {}
        for obj in objects:
            try:
                changed = self.ensure(obj)
                if changed:
                    LOG.info("%s %d: %s", self.LABEL, self.key(obj), "; ".join(changed))
                out[owner_key(obj.owner)] = {"status": "active", "reason": None, "applied": digest([obj])}
            except Exception as e:  # noqa: BLE001 - the object's status; retried on the next resync
                LOG.warning("%s %d: %s", self.LABEL, self.key(obj), e)
                out[owner_key(obj.owner)] = {"status": "error", "reason": str(e)[:1000], "applied": digest([obj])}
        for key in sorted(self.held() - {self.key(o) for o in objects}):
            try:
                self.remove(key)
            except Exception as e:  # noqa: BLE001 - retried on the next resync
                LOG.warning("removing %s %d: %s", self.LABEL, key, e)
        return out

