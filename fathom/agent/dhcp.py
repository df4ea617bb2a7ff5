"""DHCP servers on this node: one dnsmasq per network, in its own small namespace, static only.

Per network N (fathom.model.hostlocal.DhcpServer): the namespace `<prefix>N` holds `dh<N>` (the
server's MAC, one address per DHCP-enabled subnet, the network's MTU); its veth peer `dhp<N>` is on
br-int, where the tenant compiler makes it the only place this node's ports' DHCP requests go.
dnsmasq answers exactly the static leases it is given (dhcp-host entries, `static` ranges: no
dynamic pool), with mask, router, DNS servers, MTU and classless static routes. The prefix names
the namespaces this agent owns (`fathom-d` by default; the lab uses `<lab>-<node>-d`).

`apply` is idempotent: files are rewritten only when their content changes; a changed lease list or
option set is a SIGHUP (dnsmasq rereads its hosts and options files), a changed subnet set is a
restart; a running dnsmasq with the right configuration is adopted after an agent restart.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import signal
import time
from pathlib import Path

from fathom.agent.local import LocalOvs, NamespaceObjects, alive, bring_up_veth, links, namespaces, set_ipv4_addresses
from fathom.host.exec import run
from fathom.model.hostlocal import DhcpServer

LOG = logging.getLogger("fathom.agent.dhcp")
BRIDGE = "br-int"


def render(obj: DhcpServer, folder: Path) -> dict[str, str]:
    """The files of one server: {"dnsmasq.conf", "hosts", "opts"} -> content (pure)."""
    conf = [
        "# written by the fathom agent: static leases only",
        "port=0", "no-resolv", "no-hosts", "user=root", "leasefile-ro", "dhcp-authoritative",
        f"interface={obj.inner}", "bind-interfaces",
        f"pid-file={folder / 'dnsmasq.pid'}",
        f"dhcp-hostsfile={folder / 'hosts'}",
        f"dhcp-optsfile={folder / 'opts'}",
    ]
    opts = [f"option:mtu,{obj.mtu}"]
    for sub in obj.subnets:
        net = ipaddress.IPv4Network(sub.cidr)
        tag = f"s{sub.subnet_id}"
        conf.append(f"dhcp-range=set:{tag},{net.network_address},static,{net.netmask},{obj.lease_time}")
        routes = list(sub.host_routes)
        if sub.gateway_ip:
            opts.append(f"tag:{tag},option:router,{sub.gateway_ip}")
            # a client given classless routes ignores the router option: the default goes in too
            # (unless a host route is the default already)
            if routes and all(d != "0.0.0.0/0" for d, _ in routes):
                routes.append(("0.0.0.0/0", sub.gateway_ip))
        else:
            opts.append(f"tag:{tag},option:router")
        if routes:
            opts.append(f"tag:{tag},option:classless-static-route," + ",".join(f"{d},{h}" for d, h in routes))
        if sub.dns_nameservers:
            opts.append(f"tag:{tag},option:dns-server," + ",".join(sub.dns_nameservers))
    hosts = [f"{h.mac},{h.ip},{h.hostname},{obj.lease_time}" for h in obj.hosts]
    return {"dnsmasq.conf": "\n".join(conf) + "\n", "hosts": "\n".join(hosts) + "\n", "opts": "\n".join(opts) + "\n"}


class DhcpServers(NamespaceObjects):
    KIND = DhcpServer.KIND
    LABEL = "dhcp of network"

    def __init__(self, ovs: LocalOvs, state_dir: str | Path, prefix: str = "fathom-d"):
        super().__init__(ovs, prefix)
        self.root = Path(state_dir) / "dhcp"

    def key(self, obj: DhcpServer) -> int:
        return obj.network_id

    def folder(self, network_id: int) -> Path:
        return self.root / str(network_id)

    # ----- the namespace and its port
    def _plumb(self, obj: DhcpServer, ns: str) -> list[str]:
        changed = []
        if ns not in namespaces():
            run(["ip", "netns", "add", ns])
            run(["ip", "link", "set", "lo", "up"], ns)
            changed.append("namespace created")
        inside = {link["ifname"]: link for link in links(ns)}
        here = {link["ifname"]: link for link in links()}
        inner, outer = obj.inner, obj.outer
        if inner not in inside or outer not in here:
            run(["ip", "link", "del", outer], check=False)
            run(["ip", "link", "del", inner], ns, check=False)
            run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns])
            changed.append(f"{inner} created")
            inside[inner] = {"ifname": inner, "address": None, "flags": [], "mtu": None}
            here[outer] = {"ifname": outer, "flags": []}
        if (inside[inner].get("address") or "").lower() != obj.mac.lower():
            run(["ip", "link", "set", inner, "address", obj.mac], ns)
            changed.append(f"{inner} mac")
        if inside[inner].get("mtu") != obj.mtu:
            run(["ip", "link", "set", inner, "mtu", str(obj.mtu)], ns)
        changed += set_ipv4_addresses(ns, inner, {ipaddress.IPv4Interface(s.server_address) for s in obj.subnets})
        bring_up_veth(((ns, inner, inside[inner]), (None, outer, here[outer])))
        if outer not in self.ovs.ports(BRIDGE):
            self.ovs.add_port(BRIDGE, outer)
            changed.append(f"{outer} on {BRIDGE}")
        return changed

    # ----- dnsmasq
    def _pid(self, folder: Path) -> int | None:
        """The pid of the dnsmasq serving `folder`, if it runs (its command line names our conf)."""
        try:
            pid = int((folder / "dnsmasq.pid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            return None
        return pid if alive(pid) and str(folder / "dnsmasq.conf") in cmdline else None

    def ensure(self, obj: DhcpServer) -> list[str]:
        ns = self.namespace(obj.network_id)
        changed = self._plumb(obj, ns)
        folder = self.folder(obj.network_id)
        folder.mkdir(parents=True, exist_ok=True)
        rewritten = set()
        for name, text in render(obj, folder).items():
            path = folder / name
            if not path.exists() or path.read_text() != text:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                os.replace(tmp, path)
                rewritten.add(name)
        pid = self._pid(folder)
        if pid is not None and "dnsmasq.conf" in rewritten:
            self._stop(pid)
            pid = None
        if pid is None:
            run(["dnsmasq", f"--conf-file={folder / 'dnsmasq.conf'}"], ns)
            changed.append("dnsmasq started")
        elif rewritten:
            os.kill(pid, signal.SIGHUP)   # rereads the hosts and options files
            changed.append("dnsmasq reloaded")
        return changed

    @staticmethod
    def _stop(pid: int) -> None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def remove(self, network_id: int) -> None:
        folder = self.folder(network_id)
        pid = self._pid(folder)
        if pid is not None:
            self._stop(pid)
        ns = self.namespace(network_id)
        run(["ip", "netns", "del", ns], check=False)
        self.ovs.del_port(BRIDGE, f"dhp{network_id}")
        run(["ip", "link", "del", f"dhp{network_id}"], check=False)
        LOG.info("dhcp of network %d: namespace %s removed", network_id, ns)
