"""The OpenStack section of the demo (`make demo-openstack`, `python -m fathom.demo --openstack`):
a real Neutron drives fathom, through the `openstack` command line an operator would type.

One lab (compute1, compute2 and a gateway node under fathom's controller, no VM of its own), a
Neutron API server from PyPI with networking-fathom's drivers (fathom/lab/neutron.py: gunicorn,
SQLite, no Keystone, a fathom `service` token), then: two networks and subnets, a router with both,
ports bound to the lab's nodes, VMs plugged for those ports as os-vif would (`fathom lab plug
--neutron-port`), pings within and across subnets, a security group rule taking effect, a floating
IP reached from the upstream host, a TaaS tap service receiving copies and a networking-sfc port
chain steering traffic. Each step prints the commands it runs and what its result shows.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.markup import escape

from fathom.client import Client
from fathom.lab.capture import Capture
from fathom.lab.lab import Lab
from fathom.lab.neutron import TOPOLOGY, UPSTREAM_MAC, VENV, NeutronServer, available
from fathom.lab.ovs import wait_for
from fathom.lab.sh import LabError
from fathom.lab.topology import parse

FATHOM = str(Path(sys.executable).with_name("fathom"))
EXTERNAL_CIDR, UPSTREAM_IP, EXTERNAL_VLAN = "203.0.113.0/24", "203.0.113.1", 300


class OpenStackDemo:
    """The lab, the Neutron server and the clients of one run; each method is one step."""

    def __init__(self, console: Console, report: list, lab: Lab):
        self.console, self.report, self.lab = console, report, lab
        self.server: NeutronServer | None = None
        self.admin: Client | None = None
        self.ports: dict[str, dict] = {}        # VM name -> its Neutron port
        self.commands, self.command_seconds = 0, 0.0    # `openstack` commands run, and their time

    # ----- helpers -----
    def say(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def check(self, what: str, ok: bool, detail: str) -> bool:
        """One line of the report; a failed check is marked FAILED (the demo's exit status)."""
        self.say(f"  {'[green]ok[/green]' if ok else '[red]FAILED[/red]'} {what}: {detail}")
        self.report.append((what, detail if ok else f"{detail} - FAILED"))
        return ok

    def openstack(self, *args: str, output: bool = True):
        """Run `openstack …` against the demo's Neutron, printed as typed; its JSON answer (-f json),
        or with `output` False what it printed."""
        self.say(f"  [dim]$ openstack {escape(shlex.join(args))}[/dim]")
        t0 = time.monotonic()
        try:
            proc = self.server.cli(*args, *(("-f", "json") if output else ()))
        except AssertionError as e:
            raise LabError(str(e)) from None
        finally:
            self.commands += 1
            self.command_seconds += time.monotonic() - t0
        return json.loads(proc.stdout) if output else proc.stdout

    def fathom(self, collection: str, neutron_id: str) -> dict | None:
        """fathom's object that a driver made for the Neutron object `neutron_id`."""
        found = self.admin.list(f"/{collection}", params={"external_id": neutron_id})
        return found[0] if found else None

    @staticmethod
    def wait(what: str, check, timeout: float = 30.0):
        return wait_for(check, timeout, what, interval=0.3)

    def fathom_bound(self, neutron_port: str) -> dict:
        return self.wait(f"port {neutron_port} bound in fathom",
                         lambda: (lambda p: p if p and p["node"] else None)(self.fathom("ports", neutron_port)))

    def neutron_status(self, port_id: str) -> str:
        return httpx.get(f"{self.server.url}/v2.0/ports/{port_id}", timeout=10).json()["port"]["status"]

    def ip(self, vm: str) -> str:
        return self.ports[vm]["fixed_ips"][0]["ip_address"]

    def port(self, vm: str, network: str, host: str, *extra: str, device: str | None = None) -> dict:
        """A Neutron port bound to `host` for Nova's instance `device` (what Nova asks for when it
        boots a VM there)."""
        self.ports[vm] = self.openstack("port", "create", "--network", network, "--host", host, "--device-owner",
                                        "compute:nova", "--device", device or f"vm-{vm}", *extra, vm)
        return self.ports[vm]

    def plug(self, *vms: str) -> None:
        """VMs for their ports (as os-vif would), then each port ACTIVE in Neutron."""
        for vm in vms:
            self.fathom_bound(self.ports[vm]["id"])
            self.say(f"  [dim]$ fathom lab plug -n {self.lab.name} --neutron-port {self.ports[vm]['id']} --vm {vm}[/dim]")
            out = subprocess.run([FATHOM, "lab", "plug", "-n", self.lab.name, "--neutron-port", self.ports[vm]["id"],
                                  "--vm", vm], capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise LabError(f"fathom lab plug {vm}: {out.stderr.strip()}")
        for vm in vms:
            self.wait(f"{vm} ACTIVE in Neutron", lambda: self.neutron_status(self.ports[vm]["id"]) == "ACTIVE")

    def ping(self, src: str, dst_ip: str, count: int = 3) -> float | None:
        """Average RTT (ms) of `count` pings from `src`, None when none was answered."""
        out = self.lab.run(src, "ping", "-c", str(count), "-i", "0.2", "-W", "1", dst_ip).stdout
        m = re.search(r"= [\d.]+/([\d.]+)/", out)
        return float(m.group(1)) if m else None

    def reaches(self, src: str, dst_ip: str, timeout: float = 15) -> float | None:
        """RTT once `src` reaches `dst_ip` within `timeout` s (a new path's first echoes may be lost
        while the last switch takes its flows), None if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            rtt = self.ping(src, dst_ip)
            if rtt is not None or time.monotonic() > deadline:
                return rtt
            time.sleep(0.5)

    def echo_requests_at(self, at: str, src: str, dst_ip: str, count: int = 3) -> int:
        """Echo requests from VM `src` to `dst_ip` that VM `at` receives while `src` pings `dst_ip`."""
        with tempfile.TemporaryDirectory() as tmp:
            with Capture(self.lab.ns(at), "eth0", Path(tmp) / "icmp.pcap",
                         f"icmp[icmptype] == icmp-echo and src host {self.ip(src)} and dst host {dst_ip}") as cap:
                self.ping(src, dst_ip, count=count + 2)
            return min(count, len(cap.fields("frame.number")))

    # ----- the steps -----
    def start(self) -> None:
        self.console.rule("[bold]OpenStack: a real Neutron drives fathom (networking-fathom, `openstack` CLI)")
        why = available()
        if why:
            raise LabError(why)
        with self.console.status("bringing up the lab (compute1, compute2, gw) under fathom's controller"):
            t0 = time.monotonic()
            state = self.lab.up(parse(TOPOLOGY, "<demo openstack>"), "<demo openstack>")
        self.admin = Client.for_lab(state)
        self.check("lab up (fathom controller)", True, f"{time.monotonic() - t0:.1f} s, controller "
                   f"{state['controller']['url']}, nodes compute1 compute2 gw")
        token = self.admin.post("/tokens", json={"project_id": "services", "roles": ["service"],
                                                 "name": "neutron"})["token"]
        with self.console.status("starting Neutron's API (gunicorn, SQLite) with fathom's drivers"):
            t0 = time.monotonic()
            self.server = NeutronServer(self.lab.dir / "neutron", state["controller"]["url"], token)
            self.server.start()
        version = next((p.name[len("neutron-"):-len(".dist-info")]
                        for p in VENV.glob("lib/python*/site-packages/neutron-*.dist-info")), "?")
        self.check("Neutron API up", True, f"neutron {version} at {self.server.url}, {time.monotonic() - t0:.1f} s")
        self.say("  ML2 mechanism driver fathom, fathom's L3 flavors, TaaS and SFC drivers; a fathom token of "
                 "role service")

    def networks_and_router(self) -> None:
        self.console.rule("networks, subnets and a router, made in Neutron")
        nets = {}
        for name, cidr in (("blue", "10.10.1.0/24"), ("red", "10.10.2.0/24")):
            nets[name] = self.openstack("network", "create", name)
            self.openstack("subnet", "create", "--network", name, "--subnet-range", cidr, f"{name}4")
        router = self.openstack("router", "create", "r1")
        for name in nets:
            self.openstack("router", "add", "subnet", "r1", f"{name}4", output=False)
        for name, net in nets.items():
            mine = self.wait(f"{name} in fathom", lambda: self.fathom("networks", net["id"]))
            self.check(f"network {name} in fathom", mine["segmentation_id"] is not None,
                       f"fathom network {mine['id']} ({mine['type']} {mine['segmentation_id']}) under Neutron's "
                       f"UUID {net['id'][:8]}…")
        r = self.wait("r1 with two interfaces in fathom", lambda: (
            lambda x: x if x and len(x["interfaces"]) == 2 else None)(self.fathom("routers", router["id"])))
        self.check("router r1 in fathom", r["mode"] == "distributed",
                   f"mode {r['mode']} (the default flavor), interfaces "
                   + ", ".join(sorted(i["ip_address"] for i in r["interfaces"])))

    def ports_and_vms(self) -> None:
        self.console.rule("ports bound to lab nodes, VMs plugged for them")
        for vm, net, host in (("a1", "blue", "compute1"), ("a2", "blue", "compute2"), ("b1", "red", "compute2")):
            self.port(vm, net, host)
        bound = {vm: self.fathom_bound(p["id"]) for vm, p in self.ports.items()}
        down = {vm: self.neutron_status(p["id"]) for vm, p in self.ports.items()}
        self.check("ports bound, not yet carried", set(down.values()) == {"DOWN"},
                   ", ".join(f"{vm} on {b['node']} {down[vm]}" for vm, b in bound.items()))
        self.plug("a1", "a2", "b1")
        self.check("ports ACTIVE once plugged", True, "Neutron's port status follows fathom's (provisioning block)")
        self.console.print(self.openstack("port", "list", "--device-owner", "compute:nova", "-c", "Name", "-c",
                                          "Status", "-c", "Fixed IP Addresses", output=False).rstrip(), markup=False)
        for what, src, dst in (("ping a1 → a2, same subnet, across nodes", "a1", "a2"),
                               ("ping a1 → b1, across subnets (router r1)", "a1", "b1"),
                               ("ping b1 → a1, across subnets (router r1)", "b1", "a1")):
            rtt = self.reaches(src, self.ip(dst))
            self.check(what, rtt is not None, f"avg {rtt:.3f} ms" if rtt is not None else "no answer")

    def security_group(self) -> None:
        self.console.rule("a security group rule, made in Neutron, enforced by fathom")
        web = self.openstack("security", "group", "create", "web")
        self.port("w1", "blue", "compute1", "--security-group", "web")
        self.plug("w1")
        group = self.wait("web in fathom", lambda: self.fathom("security-groups", web["id"]))
        self.admin.wait_status("security-groups", group["id"], timeout=20)
        before = self.ping("a2", self.ip("w1"), count=2)
        self.check("ping a2 → w1, group web without ingress rule", before is None,
                   "dropped" if before is None else f"answered ({before:.3f} ms)")
        rule = self.openstack("security", "group", "rule", "create", "--ingress", "--protocol", "icmp", "web")
        t0 = time.monotonic()
        self.wait("the rule in fathom", lambda: self.fathom("security-group-rules", rule["id"]))
        self.admin.wait_status("security-groups", group["id"], timeout=20)
        after = self.reaches("a2", self.ip("w1"))
        self.check("ping a2 → w1 after the ICMP rule", after is not None,
                   f"answered {time.monotonic() - t0:.1f} s after the rule was made" if after is not None
                   else "still dropped")

    def floating_ip(self) -> None:
        self.console.rule("an external network and a floating IP, reached from the upstream host")
        ext = self.openstack("network", "create", "--external", "--provider-network-type", "vlan",
                             "--provider-physical-network", "physnet1", "--provider-segment", str(EXTERNAL_VLAN), "ext")
        self.openstack("subnet", "create", "--network", "ext", "--subnet-range", EXTERNAL_CIDR, "--gateway",
                       UPSTREAM_IP, "--no-dhcp", "ext4")
        self.wait("ext in fathom", lambda: self.fathom("networks", ext["id"]))
        # the provider router (namespace `up`), wired to the gateway node's uplink on the external VLAN
        self.lab.wire_upstream(self.lab.node("gw"), "up", UPSTREAM_MAC, f"{UPSTREAM_IP}/24", EXTERNAL_VLAN)
        self.openstack("router", "set", "--external-gateway", "ext", "r1", output=False)
        # the VMs' group (the project's default) admits ICMP from the provider's network
        default = next(g for g in self.openstack("security", "group", "list")
                       if g["Name"] == "default" and g["Project"] == ext["project_id"])
        self.openstack("security", "group", "rule", "create", "--ingress", "--protocol", "icmp", "--remote-ip",
                       EXTERNAL_CIDR, default["ID"])
        fip = self.openstack("floating", "ip", "create", "--port", "a1", "ext")
        address = fip["floating_ip_address"]
        mine = self.wait("the floating IP in fathom", lambda: self.fathom("floatingips", fip["id"]))
        self.admin.wait_status("floatingips", mine["id"], timeout=30)
        rtt = self.reaches("up", address)
        self.check(f"ping upstream {UPSTREAM_IP} → floating IP {address} (a1 {self.ip('a1')})", rtt is not None,
                   f"avg {rtt:.3f} ms, NAT on the gateway node" if rtt is not None else "no answer")

    def tap(self) -> None:
        self.console.rule("TaaS: a tap service receives copies of a port's traffic")
        self.port("mon", "blue", "compute1")
        self.plug("mon")
        self.openstack("tap", "service", "create", "--name", "ids", "--port", "mon")
        flow = self.openstack("tap", "flow", "create", "--name", "a2-out", "--port", "a2", "--tap-service", "ids",
                              "--direction", "OUT")
        policy = self.wait("the tap policy in fathom", lambda: self.fathom("taps", flow["id"]))
        self.admin.wait_status("taps", policy["id"], timeout=20)
        seen = self.echo_requests_at("mon", "a2", self.ip("a1"))
        self.check("tap flow a2 OUT → tap service ids (VM mon)", seen == 3,
                   f"mon received {seen}/3 of a2's echo requests to a1, across the tunnel")

    def port_chain(self) -> None:
        self.console.rule("networking-sfc: a port chain steers a1's ICMP to b1 through a VNF")
        for side in ("in", "out"):      # one VNF instance's two ports (networking-sfc checks)
            self.port(f"vnf{side}", "blue", "compute2", "--disable-port-security", device="vm-vnf")
        self.plug("vnfin", "vnfout")
        self.openstack("sfc", "port", "pair", "create", "--ingress", "vnfin", "--egress", "vnfout", "pp1")
        self.openstack("sfc", "port", "pair", "group", "create", "--port-pair", "pp1", "ppg1")
        self.openstack("sfc", "flow", "classifier", "create", "--ethertype", "IPv4", "--protocol", "icmp",
                       "--logical-source-port", "a1", "--destination-ip-prefix", f"{self.ip('b1')}/32", "icmp-to-b1")
        chain = self.openstack("sfc", "port", "chain", "create", "--port-pair-group", "ppg1", "--flow-classifier",
                               "icmp-to-b1", "pc1")["ID"]          # (networking-sfc's client: column titles)
        mine = self.wait("the chain in fathom", lambda: self.fathom("sfc/port_chains", chain))
        self.admin.wait_status("sfc/port_chains", mine["id"], timeout=30)
        seen = self.echo_requests_at("vnfin", "a1", self.ip("b1"))
        self.check("port chain pc1 steers a1 → b1 into the VNF", seen == 3,
                   f"the VNF's ingress port received {seen}/3 of a1's echo requests to b1")
        self.openstack("sfc", "port", "chain", "delete", "pc1", output=False)
        self.wait("the chain gone from fathom", lambda: self.fathom("sfc/port_chains", chain) is None)
        rtt = self.reaches("a1", self.ip("b1"))
        self.check("chain deleted: a1 → b1 direct again", rtt is not None,
                   f"avg {rtt:.3f} ms" if rtt is not None else "no answer")

    def stop(self, keep: bool) -> None:
        if self.admin:
            self.admin.close()
        if keep and self.server:
            self.say(f"\nNeutron left up at {self.server.url} (logs in {self.server.dir}); try:\n"
                     f"  OS_AUTH_TYPE=none OS_ENDPOINT={self.server.url} {VENV}/bin/openstack port list\n"
                     f"'fathom lab down -n {self.lab.name}' removes the lab and stops Neutron")
            return
        if self.server:
            self.server.stop()
        self.lab.down()


def section(console: Console, report: list, lab_name: str, keep: bool = False) -> None:
    """The whole OpenStack section; everything it made is removed unless `keep` (and it succeeded)."""
    lab = Lab(lab_name)
    lab.down()        # a previous run's lab, and its Neutron server
    demo = OpenStackDemo(console, report, lab)
    ok = False
    t0 = time.monotonic()
    try:
        demo.start()
        demo.networks_and_router()
        demo.ports_and_vms()
        demo.security_group()
        demo.floating_ip()
        demo.tap()
        demo.port_chain()
        ok = True
    except Exception:
        if demo.server:     # what Neutron and the driver said
            console.print(demo.server.log_tail(20), highlight=False, markup=False)
        raise
    finally:
        report.append(("OpenStack section", f"{time.monotonic() - t0:.0f} s, of which {demo.command_seconds:.0f} s "
                                            f"in {demo.commands} `openstack` commands"))
        demo.stop(keep and ok)
