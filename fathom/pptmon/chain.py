"""A service chain in network namespaces: client - VNF1 - ... - VNFn - server.

Every node is a namespace joined to the chain's host namespace by one veth per link; in the
host namespace each link is a Linux bridge holding the two host-side veth ends (the
hypervisor side of an OpenStack VM's tap).  Guest-mode PPTMon attaches inside a VNF
namespace (in0 ingress, out0 egress); host-mode on the host-side ends of the VNF's veths.

    <chain>-client eth0 ─ h0o ┐br0┌ h1i ─ in0 <chain>-vnf1 out0 ─ h1o ┐br1┌ h2i ─ in0 ...
                              (in <chain>-host)

Link i (0..n) joins node i and node i+1 and uses 198.18.(base+i).0/24 (.1 left, .2 right)
and 2001:2:0:(base+i)::/64 (the IPv6 benchmarking range); nothing leaves the namespaces.
VNF links get an MTU of 1500 + headroom so that a full-size packet still fits once the
PPTMon option is added; the client and server keep 1500.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fathom.host import exec as host_exec

STATE_ROOT = Path(os.environ.get("FATHOM_PPTMON_STATE", "/run/fathom/pptmon"))
NAME_RE = re.compile(r"^p[pam][a-z0-9]{0,8}$")  # pp…/pm…: PPTMon chains; pa…: the agent's tests
VNF_KINDS = ("forward", "firewall", "nat")


class ChainError(RuntimeError):
    pass


@dataclass
class Vnf:
    kind: str = "forward"
    rules: int = 0  # firewall: number of non-matching rules every packet is checked against

    def label(self) -> str:
        return f"firewall:{self.rules}" if self.kind == "firewall" else self.kind


@dataclass
class Chain:
    name: str
    vnfs: list[Vnf] = field(default_factory=lambda: [Vnf()])
    base: int = 200        # third octet of the first link's 198.18.x.0/24
    headroom: int = 64     # extra MTU on VNF links for the in-band option
    offloads: bool = True  # checksum/segmentation offloads on every veth

    # ---- naming --------------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self.vnfs)

    @property
    def host(self) -> str:
        return f"{self.name}-host"

    @property
    def client(self) -> str:
        return f"{self.name}-client"

    @property
    def server(self) -> str:
        return f"{self.name}-server"

    def vnf_ns(self, k: int) -> str:
        return f"{self.name}-vnf{k}"

    def namespaces(self) -> list[str]:
        return [self.host, self.client] + [self.vnf_ns(k) for k in range(1, self.n + 1)] + [self.server]

    def node_ns(self, i: int) -> str:
        if i == 0:
            return self.client
        if i == self.n + 1:
            return self.server
        return self.vnf_ns(i)

    def v4(self, link: int, side: int) -> str:
        return f"198.18.{self.base + link}.{side}"

    def v6(self, link: int, side: int) -> str:
        return f"2001:2:0:{self.base + link:x}::{side}"

    @property
    def server_ip(self) -> str:
        return self.v4(self.n, 2)

    @property
    def server_ip6(self) -> str:
        return self.v6(self.n, 2)

    @property
    def client_ip(self) -> str:
        return self.v4(0, 1)

    def state_dir(self) -> Path:
        return STATE_ROOT / self.name

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Chain":
        d = dict(d)
        d["vnfs"] = [Vnf(**v) for v in d.get("vnfs", [])]
        return cls(**d)

    def validate(self) -> None:
        if not NAME_RE.match(self.name):
            raise ChainError(f"chain name {self.name!r}: use 'pp', 'pm' or 'pa' + up to 8 of [a-z0-9]")
        if not 1 <= self.n <= 8:
            raise ChainError("a chain has 1 to 8 VNFs")
        if not 0 <= self.base <= 255 - self.n:
            raise ChainError("base must leave room for n+1 /24 links in 198.18.0.0/16")
        for v in self.vnfs:
            if v.kind not in VNF_KINDS:
                raise ChainError(f"unknown VNF kind {v.kind!r} (one of {', '.join(VNF_KINDS)})")


def parse_vnfs(spec: str) -> list[Vnf]:
    """'firewall:20,nat,forward' -> [Vnf('firewall', 20), Vnf('nat'), Vnf('forward')]."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kind, _, arg = item.partition(":")
        kind = {"fw": "firewall", "fwd": "forward"}.get(kind, kind)
        out.append(Vnf(kind=kind, rules=int(arg) if arg else (20 if kind == "firewall" else 0)))
    return out


# ---- running commands -------------------------------------------------------------------

def run(*args: str, ns: str | None = None, check: bool = True, input: str | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess:
    """fathom.host.exec.run for chain set-up: failures raise ChainError."""
    return host_exec.run(args, ns, check=check, input=input, timeout=timeout, error=ChainError)


existing_namespaces = host_exec.namespaces


# ---- build and tear down ----------------------------------------------------------------

def _firewall_rules(n: int) -> str:
    """iptables-restore input: n FORWARD rules that never match chain traffic
    (sources from 198.19.0.0/16), then the default ACCEPT policy."""
    lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]"]
    for i in range(n):
        lines.append(f"-A FORWARD -s 198.19.{(i >> 8) & 255}.{i & 255}/32 -p udp "
                     f"--dport {1 + i % 60000} -j DROP")
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def set_offloads(chain: Chain, on: bool) -> None:
    """TX checksum / TSO / GSO on every veth end of the chain (both sides)."""
    state = "on" if on else "off"
    for ns, devs in _veths(chain).items():
        for dev in devs:
            run("ethtool", "-K", dev, "tx", state, "tso", state, "gso", state, ns=ns, check=False)


def _veths(chain: Chain) -> dict[str, list[str]]:
    devs: dict[str, list[str]] = {chain.host: [], chain.client: ["eth0"], chain.server: ["eth0"]}
    devs[chain.host] += ["h0o", f"h{chain.n + 1}i"]
    for k in range(1, chain.n + 1):
        devs[chain.vnf_ns(k)] = ["in0", "out0"]
        devs[chain.host] += [f"h{k}i", f"h{k}o"]
    return devs


def up(chain: Chain) -> Chain:
    chain.validate()
    clash = [ns for ns in existing_namespaces() if ns.startswith(chain.name + "-")]
    if clash:
        raise ChainError(f"chain {chain.name} already exists ({', '.join(clash)}); "
                         f"run 'fathom pptmon chain down {chain.name}'")
    try:
        _build(chain)
    except Exception:
        down(chain.name)
        raise
    d = chain.state_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / "chain.json").write_text(json.dumps(chain.to_json(), indent=2))
    return chain


def _build(chain: Chain) -> None:
    n = chain.n
    vmtu = 1500 + chain.headroom
    for ns in chain.namespaces():
        run("ip", "netns", "add", ns)
        run("ip", "-n", ns, "link", "set", "lo", "up")
    h = chain.host
    for i in range(n + 1):
        run("ip", "-n", h, "link", "add", f"br{i}", "type", "bridge")
        run("ip", "-n", h, "link", "set", f"br{i}", "up")
    # node i's out-side veth (on link i) and in-side veth (on link i-1)
    for i in range(n + 2):
        ns = chain.node_ns(i)
        mtu = 1500 if i in (0, n + 1) else vmtu
        sides = []
        if i <= n:
            sides.append(("out0" if i else "eth0", f"h{i}o", i, 1))
        if i >= 1:
            sides.append(("in0" if i <= n else "eth0", f"h{i}i", i - 1, 2))
        for dev, hdev, link, host_part in sides:
            run("ip", "-n", h, "link", "add", hdev, "mtu", str(mtu), "type", "veth",
                "peer", "name", dev, "netns", ns, "mtu", str(mtu))
            run("ip", "-n", h, "link", "set", hdev, "master", f"br{link}", "up")
            run("ip", "-n", ns, "addr", "add", f"{chain.v4(link, host_part)}/24", "dev", dev)
            run("ip", "-n", ns, "-6", "addr", "add", f"{chain.v6(link, host_part)}/64", "dev", dev,
                "nodad")
            run("ip", "-n", ns, "link", "set", dev, "up")
    # routes: everything to the right via the next hop, to the left via the previous one
    run("ip", "-n", chain.client, "route", "add", "default", "via", chain.v4(0, 2))
    run("ip", "-n", chain.client, "-6", "route", "add", "default", "via", chain.v6(0, 2))
    run("ip", "-n", chain.server, "route", "add", "default", "via", chain.v4(n, 1))
    run("ip", "-n", chain.server, "-6", "route", "add", "default", "via", chain.v6(n, 1))
    for k in range(1, n + 1):
        ns = chain.vnf_ns(k)
        run("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=ns)
        run("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1", ns=ns)
        if k < n:
            run("ip", "-n", ns, "route", "add", "default", "via", chain.v4(k, 2))
            run("ip", "-n", ns, "-6", "route", "add", "default", "via", chain.v6(k, 2))
        for link in range(0, k - 1):
            run("ip", "-n", ns, "route", "add", f"198.18.{chain.base + link}.0/24",
                "via", chain.v4(k - 1, 1))
            run("ip", "-n", ns, "-6", "route", "add", f"2001:2:0:{chain.base + link:x}::/64",
                "via", chain.v6(k - 1, 1))
        vnf = chain.vnfs[k - 1]
        if vnf.kind == "firewall":
            run("iptables-restore", ns=ns, input=_firewall_rules(vnf.rules))
        elif vnf.kind == "nat":
            run("iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "out0", "-j", "MASQUERADE",
                ns=ns)
    set_offloads(chain, chain.offloads)


def load(name: str) -> Chain:
    f = STATE_ROOT / name / "chain.json"
    if not NAME_RE.match(name) or not f.is_file():
        raise ChainError(f"no chain {name!r} (fathom pptmon chain up {name} ...)")
    return Chain.from_json(json.loads(f.read_text()))


def list_chains() -> list[Chain]:
    """The chains whose state directory holds a chain.json.  Only names a chain can have
    are looked at: the state root also holds other things, such as the bpffs mount of the
    loaders' pinned maps (.bpffs), which outlives the chains and refuses lookups."""
    try:
        entries = sorted(STATE_ROOT.iterdir())
    except FileNotFoundError:
        return []
    out = []
    for d in entries:
        if not NAME_RE.match(d.name):
            continue
        try:
            text = (d / "chain.json").read_text()
        except (FileNotFoundError, NotADirectoryError):
            continue
        out.append(Chain.from_json(json.loads(text)))
    return out


def remove(name: str) -> list[str]:
    """Delete every namespace named '<name>-*' and the chain's state. Its PPTMon loaders must be
    stopped first: fathom.pptmon.control.down does both."""
    if not NAME_RE.match(name):
        raise ChainError(f"refusing to remove {name!r}: chain names start with 'pp', 'pm' or 'pa'")
    removed = []
    for ns in existing_namespaces():
        if ns.startswith(name + "-"):
            run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    d = STATE_ROOT / name
    if d.exists():
        for f in d.iterdir():
            if f.is_file():
                f.unlink()
        d.rmdir()
    return removed
