"""Build, inspect and tear down an emulated cloud from a topology.

Naming: every namespace is `<lab>-<name>` and every root-namespace link starts with `<lab>-`, so
`down` finds all of a lab's objects by prefix even when its state file is gone or half written.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from fathom.auth.client import NoToken, lab_token
from fathom.controller.channels import manager_commands
from fathom.host import exec as host_exec
from fathom.model import EXTERNAL_INTERFACE
from fathom.pki import Pki

from .ovs import OvsInstance, kill_and_wait, process_running, supervised_state, supervisor_pid, wait_for
from .sh import LabError, require_root_and_tools, run
from .supervisor import AGENT, AGENT_CONFIG, start_supervised, stop_supervised
from .topology import PLUGS, Topology, check_lab_name, ovs_interface, vm_host_end

RUN_ROOT = Path(os.environ.get("FATHOM_RUN_ROOT", "/run/fathom"))
MGMT_POOL = ipaddress.IPv4Network("198.18.128.0/17")  # a /24 per lab unless the topology says
TUNNEL_PORT = "vxlan0"


def lab_dir(lab: str) -> Path:
    return RUN_ROOT / lab


# udhcpc's script in a lab VM: apply a lease (bound, renew) as a cloud image's client does and
# print what the server gave, one `LEASE key=value` line each
UDHCPC_SCRIPT = r"""#!/bin/sh
case "$1" in
  deconfig) ip -4 addr flush dev "$interface"; ip link set "$interface" up ;;
  bound|renew)
    ip -4 addr flush dev "$interface"
    ip addr add "$ip/$mask" dev "$interface"
    [ -n "$mtu" ] && ip link set "$interface" mtu "$mtu"
    if [ -n "$staticroutes" ]; then
      set -- $staticroutes
      while [ $# -ge 2 ]; do ip route replace "$1" via "$2" dev "$interface"; shift 2; done
    elif [ -n "$router" ]; then
      ip route replace default via "${router%% *}" dev "$interface"
    fi
    for k in ip mask subnet router mtu staticroutes dns lease serverid; do
      eval "v=\$$k"; echo "LEASE $k=$v"
    done ;;
esac
exit 0
"""


@dataclass
class NodePlan:
    name: str
    role: str
    index: int
    netns: str
    mgmt_ip: str
    tunnel_ip: str
    rundir: str


class Lab:
    """A lab as recorded in its state file (`/run/fathom/<lab>/state.json`)."""

    def __init__(self, name: str):
        check_lab_name(name)
        self.name = name
        self.dir = lab_dir(name)

    # ----- state -----
    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, state: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

    def exists(self) -> bool:
        return self.dir.exists() or bool(self.namespaces()) or bool(self.root_links())

    def ns(self, name: str) -> str:
        return f"{self.name}-{name}"

    def namespaces(self) -> list[str]:
        out = run(["ip", "-j", "netns", "list"], check=False).stdout.strip()
        names = [e["name"] for e in json.loads(out)] if out else []
        return [n for n in names if n.startswith(self.name + "-")]

    def root_links(self) -> list[str]:
        links = json.loads(run(["ip", "-j", "link", "show"]).stdout or "[]")
        return [link["ifname"] for link in links if link["ifname"].startswith(self.name + "-")]

    def ovs(self, node: str) -> OvsInstance:
        return OvsInstance(self.ns(node), self.dir / node)

    def nodes(self) -> list[NodePlan]:
        return [NodePlan(**n) for n in self.state().get("nodes", [])]

    def node(self, name: str) -> NodePlan:
        for n in self.nodes():
            if n.name == name:
                return n
        raise LabError(f"lab {self.name} has no node {name!r}")

    # ----- up -----
    def up(self, topo: Topology, source: str, standalone: bool = False, controller: str | None = None,
           progress: Callable[[str], None] = lambda s: None, insecure: bool = False,
           pki_dir: str | None = None, agent_url: str | None = None, db: str | None = None,
           replicas: int = 1, controller_options: tuple[str, ...] = ()) -> dict:
        """Build the lab. Without `standalone`, br-int is left to a controller: the one at URL
        `controller`, or one started for this lab; the lab's nodes and topology are registered.

        OpenFlow and OVSDB run over TLS unless `insecure`: a lab's own controller gets a PKI in the
        lab's run dir; a controller at `controller` needs its PKI directory as `pki_dir` (the lab
        issues each node's certificate from it). The nodes' agents reach a controller at `controller`
        at `agent_url`, by default that URL with a loopback host replaced by the management bridge's
        address (the controller must then listen there too: `--api-host 0.0.0.0`). A lab's own
        controller keeps its store in `db` (default: a SQLite file in the lab's run dir); with
        `replicas` > 1 it is that many replicas of a cluster on the PostgreSQL store `db`."""
        require_root_and_tools()
        if self.exists():
            raise LabError(f"lab {self.name!r} already exists: run 'fathom lab down {self.name}' first")
        tls = not standalone and not insecure
        if tls and controller is not None and pki_dir is None:
            raise LabError("a lab under a controller it does not start needs that controller's PKI directory "
                           "(--pki-dir) to issue node certificates, or --insecure for plain TCP")
        mgmt = topo.management or _free_mgmt_subnet()
        underlay = topo.underlay.cidr
        hosts_u, hosts_m = list(underlay.hosts()), list(mgmt.hosts())
        nodes = [NodePlan(name=n.name, role=n.role, index=i, netns=self.ns(n.name),
                          mgmt_ip=str(hosts_m[9 + i]), tunnel_ip=str(hosts_u[9 + i]),
                          rundir=str(self.dir / n.name))
                 for i, n in enumerate(topo.nodes)]
        state = {"name": self.name, "topology_file": source, "topology": topo.model_dump(mode="json"),
                 "standalone": standalone, "status": "building", "created": time.time(),
                 "tls": {"pki_dir": pki_dir or str(self.dir / "pki")} if tls else None,
                 "management": {"cidr": str(mgmt), "root_ip": str(hosts_m[0]), "bridge": f"{self.name}-mgmt"},
                 "underlay": {"cidr": str(underlay), "mtu": topo.underlay.mtu},
                 "nodes": [n.__dict__ for n in nodes]}
        self._save(state)  # first, so that `down` can find a half-built lab
        starting, built = None, False
        try:
            self._build_management(state, progress)
            if not standalone and controller is None:
                starting = self._start_own_controller(state, db, replicas, progress, controller_options)
            self._build(topo, state, nodes, standalone, progress)
            built = True
            if not standalone:
                self._attach_controller(topo, state, nodes, controller, progress, agent_url, starting)
            progress("warming the underlay neighbour tables")
            self._warm_underlay(nodes)
        except BaseException as e:
            progress("failed; removing what was built")
            if starting is not None:
                futures.wait([starting])   # its process is then in the run dir, where `down` finds it
            log = self.dir / "controller.log"   # what the controller said, once it was given the lab
            tail = log.read_text(errors="replace").splitlines()[-30:] if built and log.exists() else []
            self.keep_logs()
            self.down()
            if tail and isinstance(e, LabError):
                raise LabError(f"{e}\n--- last lines of the controller log ---\n" + "\n".join(tail)) from e
            raise
        state["status"] = "up"
        self._save(state)
        return state

    def _build_management(self, state, progress) -> None:
        mg = state["management"]
        prefix = ipaddress.IPv4Network(mg["cidr"]).prefixlen
        progress("management bridge")
        run(["ip", "link", "add", mg["bridge"], "type", "bridge"])
        run(["ip", "addr", "add", f"{mg['root_ip']}/{prefix}", "dev", mg["bridge"]])
        run(["ip", "link", "set", mg["bridge"], "up"])

    def _start_own_controller(self, state, db, replicas, progress, options=()) -> futures.Future:
        """The lab's own controller, started in the background on the management bridge's address:
        its start (mostly importing its code) overlaps the build of the nodes; `_attach_controller`
        waits for it. `options`: more `fathom controller` arguments (a test's)."""
        from . import controller as ctl
        tls = state["tls"]
        if tls:
            progress("creating the lab's PKI")
            Pki(tls["pki_dir"]).init()
        progress("starting a controller for the lab" if replicas == 1 else f"starting {replicas} controller replicas")
        pool = futures.ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-controller")
        try:
            return pool.submit(ctl.start_controller, self.dir, state["management"]["root_ip"],
                               pki_dir=tls and tls["pki_dir"], db=db, replicas=replicas, options=options)
        finally:
            pool.shutdown(wait=False)

    def _build(self, topo, state, nodes, standalone, progress) -> None:
        mtu = topo.underlay.mtu
        mg = state["management"]
        prefix = ipaddress.IPv4Network(mg["cidr"]).prefixlen

        progress("fabric switch")
        fabric = self.ns("fabric")
        _add_netns(fabric)
        fabric_ovs = OvsInstance(fabric, self.dir / "fabric")
        start_supervised(fabric_ovs)   # like systemd on a real host: restarts a crashed daemon
        fabric_ovs.vsctl("add-br", "br-fabric", "--", "set", "bridge", "br-fabric", "datapath_type=netdev",
                         "fail_mode=standalone")
        if not standalone:
            # the fabric switch is managed by the controller like the nodes (OVSDB on the management
            # network; the controller makes br-fabric fail_mode secure and connects it over OpenFlow)
            fab_ip = state["management"]["fabric_ip"] = str(hosts_m_fabric(mg["cidr"]))
            run(["ip", "link", "add", f"{self.name}-mf", "type", "veth", "peer", "name", "mgmt0", "netns", fabric])
            run(["ip", "link", "set", f"{self.name}-mf", "master", mg["bridge"], "up"])
            run(["ip", "addr", "add", f"{fab_ip}/{prefix}", "dev", "mgmt0"], ns=fabric)
            run(["ip", "link", "set", "mgmt0", "up"], ns=fabric)
            if not state["tls"]:  # with TLS the manager comes with the switch's certificate
                fabric_ovs.vsctl(*manager_commands(f"ptcp:6640:{fab_ip}"))

        for node in nodes:
            progress(f"node {node.name}")
            _add_netns(node.netns)
            ovs = OvsInstance(node.netns, node.rundir)
            start_supervised(ovs)
            # management: root bridge <-> node, OVSDB served on TCP for the controller
            root_end = f"{self.name}-m{node.index}"
            run(["ip", "link", "add", root_end, "type", "veth", "peer", "name", "mgmt0", "netns", node.netns])
            run(["ip", "link", "set", root_end, "master", mg["bridge"], "up"])
            run(["ip", "addr", "add", f"{node.mgmt_ip}/{prefix}", "dev", "mgmt0"], ns=node.netns)
            run(["ip", "link", "set", "mgmt0", "up"], ns=node.netns)
            if not state["tls"]:  # with TLS it comes with the node's certificate
                ovs.vsctl(*manager_commands(f"ptcp:6640:{node.mgmt_ip}"))
            # underlay: node ul0 <-> fabric port named after the node
            run(["ip", "link", "add", "ul0", "netns", node.netns, "mtu", mtu, "type", "veth",
                 "peer", "name", node.name, "netns", fabric, "mtu", mtu])
            for ns_, dev in ((node.netns, "ul0"), (fabric, node.name)):
                _prepare_veth_end(ns_, dev)
            # ul0 is a port of br-phy, but the kernel still sees what arrives on it and would answer
            # ARP for the tunnel address (which lives on br-phy) with ul0's own MAC: OVS would then
            # send VXLAN to a MAC nobody terminates. Only br-phy answers for its address.
            run(["sysctl", "-qw", "net.ipv4.conf.ul0.arp_ignore=1"], ns=node.netns)
            fabric_ovs.vsctl("add-port", "br-fabric", node.name)
            ovs.vsctl("add-br", "br-phy", "--", "set", "bridge", "br-phy", "datapath_type=netdev",
                      "fail_mode=standalone", f"other_config:hwaddr={_mac(0xfe, node.index)}",
                      "--", "add-port", "br-phy", "ul0",
                      "--", "set", "interface", "br-phy", f"mtu_request={mtu}")
            run(["ip", "addr", "add", f"{node.tunnel_ip}/{ipaddress.IPv4Network(state['underlay']['cidr']).prefixlen}",
                 "dev", "br-phy"], ns=node.netns)
            run(["ip", "link", "set", "br-phy", "up"], ns=node.netns)
            ovs.vsctl("add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev",
                      "fail_mode=standalone" if standalone else "fail_mode=secure",
                      "other_config:disable-in-band=true")
            # VLAN networks leave br-int through a patch pair to br-phy (trunk toward the fabric switch)
            ovs.vsctl("add-port", "br-int", "patch-phy", "--", "set", "interface", "patch-phy", "type=patch",
                      "options:peer=patch-int", "--", "add-port", "br-phy", "patch-int", "--",
                      "set", "interface", "patch-int", "type=patch", "options:peer=patch-phy")

        by_name = {n.name: n for n in nodes}
        for node_t in topo.nodes:
            node = by_name[node_t.name]
            ovs = OvsInstance(node.netns, node.rundir)
            for vm in node_t.vms:
                progress(f"vm {vm.name} on {node.name}")
                self.add_vm(node.name, vm.name, vm.mac, None if vm.dhcp else str(vm.ip),
                            None if vm.dhcp else str(topo.network(vm.network).gateway), vm.plug)
                self.plug_vm(node.name, vm.name, vm.mac, vm.network,
                             tag=_standalone_tag(topo, vm.network) if standalone else None, ovs=ovs, plug=vm.plug)
            for vnf in node_t.vnfs:
                progress(f"vnf {vnf.name} ({vnf.kind}) on {node.name}")
                self._add_vnf(topo, node, ovs, vnf, standalone)
        if topo.upstream is not None:
            self._build_upstream(topo, by_name[topo.upstream.node], progress)
        if standalone:
            progress("standalone tunnels")
            self._standalone_overlay(topo, nodes)
        progress("waiting for the switches")
        for node in nodes:
            ovs = OvsInstance(node.netns, node.rundir)
            wait_for(lambda: "br-int" in ovs.vsctl("list-br"), 10, f"br-int on {node.name}")

    def _build_upstream(self, topo: Topology, node: NodePlan, progress) -> None:
        up = topo.upstream
        net = topo.network(up.network)
        progress(f"upstream host {up.name} wired to {node.name}")
        self.wire_upstream(node, up.name, up.mac, f"{net.gateway}/{net.cidr.prefixlen}",
                           topo.segmentation_id(net) if net.type == "vlan" else None)

    def wire_upstream(self, node: NodePlan, name: str, mac: str, address: str, vlan: int | None) -> None:
        """The upstream host (the provider router of an external network) and the provider switch.

        The host is a namespace holding the external subnet's gateway address (`address`, a CIDR),
        untagged, forwarding between the addresses of its subnet (a packet from one floating IP to
        another comes back out the way a provider router hairpins it). Its wire
        and the gateway node's `ext0` meet on `br-up`, a plain learning bridge of the fabric
        namespace's OVS standing for the provider's physical switch: the host's port is an access
        port of the external network's VLAN (`vlan`; None: a flat network), `ext0`'s a trunk (the
        kernel here has no 802.1Q devices, so the host cannot tag itself). The host has no route
        beyond its subnet: floating IPs and router gateway IPs are on-link, answered by the gateway
        node (docs/external.md). Topologies declare it (`upstream:`); a cloud that makes its
        external network itself (a Neutron lab) wires it with this."""
        uns, fabric = self.ns(name), self.ns("fabric")
        _add_netns(uns)
        fabric_ovs = OvsInstance(fabric, self.dir / "fabric")
        fabric_ovs.vsctl("--may-exist", "add-br", "br-up", "--", "set", "bridge", "br-up", "datapath_type=netdev",
                         "fail_mode=standalone")
        host_end, node_end = f"u-{name}"[:15], f"x-{node.name}"[:15]
        run(["ip", "link", "add", "eth0", "netns", uns, "type", "veth", "peer", "name", host_end, "netns", fabric])
        run(["ip", "link", "add", EXTERNAL_INTERFACE, "netns", node.netns, "type", "veth",
             "peer", "name", node_end, "netns", fabric])
        run(["ip", "link", "set", "eth0", "address", mac], ns=uns)
        for ns_, dev in ((uns, "eth0"), (fabric, host_end), (fabric, node_end), (node.netns, EXTERNAL_INTERFACE)):
            _prepare_veth_end(ns_, dev)
        run(["ip", "addr", "add", address, "dev", "eth0"], ns=uns)
        # a router: a packet from one floating IP to another comes back out (hairpin)
        run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], ns=uns)
        tag = [f"tag={vlan}"] if vlan is not None else []
        fabric_ovs.vsctl("add-port", "br-up", host_end, *tag, "--", "add-port", "br-up", node_end)
        OvsInstance(node.netns, node.rundir).vsctl("add-port", "br-int", EXTERNAL_INTERFACE)

    # ----- VMs: a namespace behind a veth whose node end becomes a port of br-int -----
    def add_vm(self, node: str, name: str, mac: str, ip: str | None, gateway: str | None,
               plug: str = "direct") -> None:
        """The VM `name` on `node`: its namespace with eth0 (`mac`, `ip` as a CIDR, default route via
        `gateway`; no `ip`: it takes one by DHCP, see dhcp_vm) and the veth's node end, up but not
        yet a port of any bridge (see plug_vm). With `plug="hybrid"`, as os-vif's hybrid plugging:
        the node end is `tap<name>` on a Linux bridge `qbr<name>`, joined by a veth `qvb<name>` /
        `qvo<name>` (plug_vm puts qvo on br-int)."""
        node_ns, vns = self.ns(node), self.ns(name)
        _add_netns(vns)
        run(["ip", "link", "add", vm_host_end(name, plug), "netns", node_ns, "type", "veth", "peer", "name", "eth0",
             "netns", vns])
        run(["ip", "link", "set", "eth0", "address", mac], ns=vns)
        if ip:
            run(["ip", "addr", "add", ip, "dev", "eth0"], ns=vns)
        _prepare_veth_end(vns, "eth0")
        if gateway:
            run(["ip", "route", "add", "default", "via", gateway], ns=vns)
        _prepare_veth_end(node_ns, vm_host_end(name, plug))
        if plug == "hybrid":
            _hybrid_bridge(node_ns, name)

    def dhcp_vm(self, name: str, timeout: float = 20) -> dict[str, str]:
        """Run one DHCP exchange in the VM (busybox udhcpc on eth0, as a cloud image's client does)
        and apply the lease: address, mask, MTU, router and classless routes. Returns what the
        server offered (udhcpc's variables: ip, mask, router, mtu, staticroutes, dns, lease,
        serverid); raises LabError when no lease came."""
        script = self.dir / "udhcpc.sh"
        if not script.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            script.write_text(UDHCPC_SCRIPT)
            script.chmod(0o755)
        out = run(["udhcpc", "-i", "eth0", "-f", "-q", "-n", "-t", "4", "-T", "2", "-A", "1",
                   "-O", "mtu", "-O", "staticroutes", "-s", str(script)], ns=self.ns(name),
                  check=False, timeout=timeout)
        lease = dict(line[len("LEASE "):].split("=", 1) for line in out.stdout.splitlines()
                     if line.startswith("LEASE ") and "=" in line)
        if out.returncode != 0 or "ip" not in lease:
            raise LabError(f"no DHCP lease for {name}: {out.stdout[-500:]} {out.stderr[-500:]}")
        return lease

    def plug_vm(self, node: str, name: str, mac: str, network: str | None = None, tag: int | None = None,
                ovs: OvsInstance | None = None, plug: str = "direct") -> None:
        """Plug the VM into br-int as a hypervisor's VIF driver does: its interface there (the VM's
        veth end, or `qvo<name>` when plugged hybrid) with `external_ids:iface-id` naming the port it
        is (the VM's name)."""
        iface = ovs_interface(name, plug)
        (ovs or self.ovs(node)).vsctl(
            "add-port", "br-int", iface, *([f"tag={tag}"] if tag else []), "--", "set", "interface", iface,
            f"external_ids:iface-id={name}", f"external_ids:attached-mac={mac}",
            *([f"external_ids:fathom-network={network}"] if network else []))

    def remove_vm(self, node: str, name: str) -> None:
        """Unplug the VM (if plugged, either way) and delete its links and namespace."""
        for plug in PLUGS:
            self.ovs(node).vsctl("--if-exists", "del-port", "br-int", ovs_interface(name, plug))
        for link in (name, f"tap{name}", f"qvo{name}", f"qbr{name}"):
            run(["ip", "link", "del", link], ns=self.ns(node), check=False)
        run(["ip", "netns", "del", self.ns(name)], check=False)

    def _add_vnf(self, topo: Topology, node: NodePlan, ovs: OvsInstance, vnf, standalone: bool) -> None:
        """A VNF namespace: eth0 (ingress) and eth1 (egress) joined to br-int as `<vnf>i` and `<vnf>o`
        (plugged hybrid: as `qvo<vnf>i` and `qvo<vnf>o`, behind `tap<vnf>i`/`tap<vnf>o` on their Linux
        bridges), configured by fathom.lab.vnf for its kind."""
        from . import vnf as vnfs
        ns = self.ns(vnf.name)
        _add_netns(ns)
        for dev, port_name, port in (("eth0", f"{vnf.name}i", vnf.ingress), ("eth1", f"{vnf.name}o", vnf.egress)):
            host_end, iface = vm_host_end(port_name, vnf.plug), ovs_interface(port_name, vnf.plug)
            run(["ip", "link", "add", host_end, "netns", node.netns, "type", "veth", "peer", "name", dev, "netns", ns])
            run(["ip", "link", "set", dev, "address", port.mac], ns=ns)
            _prepare_veth_end(ns, dev)
            _prepare_veth_end(node.netns, host_end)
            if vnf.plug == "hybrid":
                _hybrid_bridge(node.netns, port_name)
            tag = _standalone_tag(topo, vnf.network) if standalone else None
            ovs.vsctl("add-port", "br-int", iface, *(["tag=%d" % tag] if tag else []), "--",
                      "set", "interface", iface, f"external_ids:iface-id={port_name}",
                      f"external_ids:attached-mac={port.mac}", f"external_ids:fathom-network={vnf.network}")
        vnfs.configure(ns, vnf, topo.network(vnf.network).cidr, self.dir / vnf.name)

    def _standalone_overlay(self, topo: Topology, nodes: list[NodePlan]) -> None:
        """Without a controller: NORMAL switching, one VXLAN port per (network, peer) as an access port.

        Tunnel ports are `protected`, so NORMAL never floods from one tunnel into another (a full
        mesh of tunnels would otherwise loop broadcasts).
        """
        for node in nodes:
            ovs = OvsInstance(node.netns, node.rundir)
            vlan_ids = []
            for i, net in enumerate(topo.networks):
                if net.type == "vlan":
                    vlan_ids.append(topo.segmentation_id(net))
                    continue
                if net.type != "vxlan":
                    continue
                for peer in nodes:
                    if peer is node:
                        continue
                    port = f"vx{i}n{peer.index}"
                    ovs.vsctl("add-port", "br-int", port, f"tag={_standalone_tag(topo, net.name)}",
                              "protected=true", "--", "set", "interface", port, "type=vxlan",
                              f"options:remote_ip={peer.tunnel_ip}", f"options:local_ip={node.tunnel_ip}",
                              f"options:key={topo.segmentation_id(net)}")
            # the patch to br-phy carries only VLAN networks; otherwise NORMAL would flood the local
            # VXLAN tags onto the underlay and learn them back from the other nodes
            if vlan_ids:
                ovs.vsctl("set", "port", "patch-phy", "vlan_mode=trunk", "trunks=" + ",".join(map(str, vlan_ids)))
            else:
                ovs.vsctl("del-port", "br-int", "patch-phy", "--", "del-port", "br-phy", "patch-int")

    def _warm_underlay(self, nodes: list[NodePlan]) -> None:
        """Every node ARPs every other tunnel endpoint once, so OVS's tunnel neighbour table is
        full when `up` returns: OVS drops the packet that makes it resolve a new neighbour, and a
        lab should start like a running cloud, not lose each path's first packet."""
        for node in nodes:
            # OVS learns a neighbour by snooping the ARP reply; a peer's earlier request already put
            # this node in the kernel's table, and the kernel would then send no request at all
            run(["ip", "neigh", "flush", "dev", "br-phy"], ns=node.netns, check=False)
            for peer in nodes:
                if peer is not node:
                    run(["ping", "-c", "1", "-W", "1", peer.tunnel_ip], ns=node.netns, check=False)

    def _attach_controller(self, topo, state, nodes, url, progress, agent_url=None,
                           starting: futures.Future | None = None) -> None:
        """Register the lab at the controller at `url`, or at its own one being started (`starting`)."""
        from . import controller as ctl
        tls = state["tls"]
        if url is None:
            progress("waiting for the controller")
            state["controller"] = starting.result()
        else:
            state["controller"] = {"url": url, "managed": False,
                                   "agent_url": agent_url or _reachable_from_nodes(url, state["management"]["root_ip"])}
        self._save(state)
        try:
            token = lab_token(state)   # the admin token of its own controller; FATHOM_TOKEN... for another
        except NoToken as e:
            raise LabError(str(e)) from None
        state["controller"]["created"] = ctl.register(
            state["controller"]["url"], topo, nodes, progress, fabric_ip=state["management"].get("fabric_ip"),
            switches_registered=lambda created: self._install_certificates(state, nodes, created, progress)
            if tls else None, token=token)
        self._save(state)
        self._start_agents(state, nodes, token, progress)
        progress("waiting for the ports to become active")
        ctl.wait_active(state["controller"]["url"], state["controller"]["created"], token=token)

    def _start_agents(self, state, nodes, token, progress) -> None:
        """Each node's agent, inside the node's namespace under its supervisor, as systemd runs
        deploy/systemd/fathom-agent.service on a real host: its own agent token, the node's OVSDB
        socket, the controller's API on the management network."""
        from . import controller as ctl
        c = state["controller"]
        fathom = Path(sys.executable).with_name("fathom")
        exe = [str(fathom)] if fathom.exists() else [sys.executable, "-m", "fathom.cli.main"]
        for node in nodes:
            progress(f"agent on {node.name}")
            rundir = Path(node.rundir)
            token_file = rundir / "agent-token"
            c["created"].setdefault("agent_tokens", {})[node.name] = ctl.issue_agent_token(
                c["url"], node.name, token_file, token=token)
            self._save(state)
            argv = [*exe, "agent", "run", "--controller", c.get("agent_url") or c["url"], "--node", node.name,
                    "--token-file", str(token_file), "--state-dir", str(rundir / "agent"),
                    "--root", str(rundir / "pptmon"), "--ovsdb", f"unix:{OvsInstance(node.netns, rundir).db_sock}",
                    "--router-ns-prefix", f"{node.netns}-r",
                    "--dhcp-ns-prefix", f"{node.netns}-d", "--log-interval", "60"]
            (rundir / AGENT_CONFIG).write_text(json.dumps({"argv": argv}))
            self.start_agent(node.name, wait=False)
        for node in nodes:
            wait_for(lambda: self.agent_pid(node.name) is not None, 30, f"the agent on {node.name}")

    # ----- agents
    def agent_pid(self, node: str) -> int | None:
        """The pid of the node's running agent (its supervisor's word), or None."""
        st = supervised_state(Path(self.node(node).rundir)) or {}
        unit = st.get("units", {}).get(AGENT) or {}
        pid = unit.get("pid")
        return pid if unit.get("state") == "running" and pid and process_running(pid) else None

    def stop_agent(self, node: str) -> None:
        """`systemctl stop fathom-agent`: the agent ends cleanly and stays stopped (what it built stays)."""
        pid = self.agent_pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: self.agent_pid(node) is None, 15, f"the agent on {node} to stop")

    def start_agent(self, node: str, wait: bool = True) -> int | None:
        """`systemctl start fathom-agent`: its supervisor starts it."""
        sup = supervisor_pid(Path(self.node(node).rundir))
        if sup is None:
            raise LabError(f"node {node} has no supervisor")
        os.kill(sup, signal.SIGUSR1)
        return wait_for(lambda: self.agent_pid(node), 30, f"the agent on {node} to start") if wait else None

    def _install_certificates(self, state, nodes, created, progress) -> None:
        """Each node and the fabric switch get a key and a certificate naming them and binding their
        datapath ids; their OVSDB then serves TLS only (pssl), and their bridges connect over TLS."""
        from fathom.model import datapath_id, datapath_id_phy, datapath_id_fabric
        pki = Pki(state["tls"]["pki_dir"])
        progress("issuing node certificates")
        holders = [(n.name, "node", {datapath_id(created["nodes"][n.name]), datapath_id_phy(created["nodes"][n.name])},
                    OvsInstance(n.netns, n.rundir), n.mgmt_ip) for n in nodes]
        for name, sid in created.get("fabric_switches", {}).items():
            holders.append((name, "switch", {datapath_id_fabric(sid)}, OvsInstance(self.ns("fabric"), self.dir / "fabric"),
                            state["management"]["fabric_ip"]))
        for name, kind, dpids, ovs, mgmt_ip in holders:
            install_certificate(pki, name, kind, dpids, ovs, mgmt_ip)

    def restart_controller(self, downtime: float = 0.0) -> None:
        """Stop the lab's own controller and start it again on the same ports and store."""
        from . import controller as ctl
        state = self.state()
        c = state.get("controller") or {}
        if not c.get("managed"):
            raise LabError(f"lab {self.name} does not run its own controller")
        if c.get("replicas"):
            raise LabError(f"lab {self.name} runs controller replicas: stop and start them one by one")
        ctl.stop_controller(self.dir)
        time.sleep(downtime)
        created = c.get("created")
        state["controller"] = ctl.start_controller(self.dir, c["of_host"], c["api_port"], c["of_port"],
                                                   pki_dir=c.get("pki_dir"), db=c.get("db"),
                                                   options=tuple(c.get("options", ())))
        state["controller"]["created"] = created
        self._save(state)

    def restart_replica(self, index: int) -> dict:
        """Stop replica `index` of the lab's controller cluster (SIGTERM: it gives its leases up) and
        start it again on the same ports and store; returns its new entry (pid) in the lab's state."""
        from . import controller as ctl
        from .ovs import kill_and_wait
        state = self.state()
        replicas = (state.get("controller") or {}).get("replicas")
        if not replicas or not 0 <= index < len(replicas):
            raise LabError(f"lab {self.name} runs no controller replica {index}")
        r = replicas[index]
        kill_and_wait(r["pid"], timeout=10)
        replicas[index] = ctl.start_replica(self.dir, r, index)
        if index == 0:
            state["controller"]["pid"] = replicas[0]["pid"]
        self._save(state)
        return replicas[index]

    # ----- down -----
    def keep_logs(self) -> None:
        """Copy the lab's logs (controller, agents, OVS) to $FATHOM_LAB_KEEP_LOGS/<lab>, when set, so
        they outlive the lab (the tests read them after a failure)."""
        keep = os.environ.get("FATHOM_LAB_KEEP_LOGS")
        if not keep or not self.dir.exists():
            return
        dest = Path(keep) / self.name
        shutil.rmtree(dest, ignore_errors=True)
        for log in self.dir.rglob("*.log"):
            target = dest / log.relative_to(self.dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, target)

    def down(self) -> list[str]:
        """Remove everything of this lab; works after crashes and half-finished ups."""
        removed = []
        ctl_state = self.state().get("controller") or {}
        if ctl_state.get("created") and not ctl_state.get("managed"):
            from .controller import deregister
            try:
                deregister(ctl_state["url"], ctl_state["created"], token=lab_token({"controller": ctl_state}))
            except NoToken:
                pass
            removed.append(f"controller objects at {ctl_state['url']}")
        # the hosts' supervisors first, or they would restart what is killed below
        for rundir in sorted(d for d in self.dir.iterdir() if d.is_dir()) if self.dir.exists() else []:
            if stop_supervised(rundir):
                removed.append(f"supervisor of {rundir.name}")
        for ns in self.namespaces():
            kill_and_wait([int(p) for p in run(["ip", "netns", "pids", ns], check=False).stdout.split()], timeout=3)
            run(["ip", "netns", "del", ns], check=False)
            removed.append(f"netns {ns}")
        for link in self.root_links():
            run(["ip", "link", "del", link], check=False)
            removed.append(f"link {link}")
        # processes of this lab that escaped their namespace (e.g. netns already deleted)
        leftover = _pids_under(self.dir)
        kill_and_wait(leftover, timeout=3)
        removed += [f"pid {p}" for p in leftover]
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
            removed.append(f"dir {self.dir}")
        return removed

    # ----- status -----
    def status(self) -> dict:
        state = self.state()
        if not state:
            raise LabError(f"no lab named {self.name!r} (see 'fathom lab list')")
        present = set(self.namespaces())
        nodes = []
        for n in self.nodes() + [NodePlan("fabric", "fabric", -1, self.ns("fabric"), "", "", str(self.dir / "fabric"))]:
            ovs = OvsInstance(n.netns, n.rundir)
            entry = {"name": n.name, "role": n.role, "netns": n.netns, "netns_present": n.netns in present,
                     "mgmt_ip": n.mgmt_ip, "tunnel_ip": n.tunnel_ip,
                     "ovsdb_server": ovs.alive("ovsdb-server"), "ovs_vswitchd": ovs.alive("ovs-vswitchd"),
                     "supervisor": _supervisor_status(n.rundir), "ovs_version": None, "bridges": {}}
            if entry["ovsdb_server"] and entry["netns_present"]:
                entry["ovs_version"] = ovs.version()
                for br in ovs.vsctl("list-br", check=False).split():
                    entry["bridges"][br] = ovs.vsctl("list-ports", br, check=False).split()
            nodes.append(entry)
        vms = []
        topo = state.get("topology", {})
        for node in topo.get("nodes", []):
            for vm in node.get("vms", []):
                vns = self.ns(vm["name"])
                up = False
                if vns in present:
                    out = run(["ip", "-j", "link", "show", "eth0"], ns=vns, check=False).stdout
                    up = bool(out) and "UP" in json.loads(out)[0].get("flags", [])
                vms.append({"name": vm["name"], "node": node["name"], "network": vm["network"],
                            "mac": vm["mac"], "ip": vm["ip"], "netns": vns, "link_up": up})
        vnfs = [{"name": v["name"], "node": node["name"], "kind": v["kind"], "network": v["network"],
                 "ingress": v["ingress"], "egress": v["egress"], "netns": self.ns(v["name"]),
                 "present": self.ns(v["name"]) in present}
                for node in topo.get("nodes", []) for v in node.get("vnfs", [])]
        return {"name": self.name, "status": state.get("status"), "standalone": state.get("standalone"),
                "topology_file": state.get("topology_file"), "management": state.get("management"),
                "underlay": state.get("underlay"), "nodes": nodes, "vms": vms, "vnfs": vnfs,
                "controller": {k: v for k, v in (state.get("controller") or {}).items() if k != "created"} or None}

    # ----- exec -----
    def exec_args(self, target: str, cmd: list[str]) -> tuple[list[str], dict]:
        """The argv and environment to run cmd in a node or VM namespace (OVS tools see that node's OVS)."""
        ns = self.ns(target)
        if ns not in self.namespaces():
            raise LabError(f"lab {self.name} has no node or VM {target!r}")
        env = dict(os.environ)
        rundir = self.dir / target
        if (rundir / "conf.db").exists():
            env.update(OvsInstance(ns, rundir).env)
        return host_exec.argv(cmd, ns), env

    def run(self, target: str, *cmd: str, check: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run cmd in a node or VM namespace and capture its output (check: a failure raises LabError
        with the command and its stderr)."""
        argv, env = self.exec_args(target, list(cmd))
        return run(argv, env=env, check=check, timeout=timeout)


def list_labs() -> list[dict]:
    names = set()
    if RUN_ROOT.exists():
        names |= {p.name for p in RUN_ROOT.iterdir() if p.is_dir()}
    out = []
    for name in sorted(names):
        try:
            lab = Lab(name)
        except ValueError:
            continue
        st = lab.state()
        if not st and not lab.namespaces():
            continue  # another tool's run dir (e.g. /run/fathom/pptmon), not a lab
        out.append({"name": name, "status": st.get("status", "unknown (no state file)"),
                    "nodes": len(st.get("nodes", [])),
                    "vms": sum(len(n.get("vms", [])) for n in st.get("topology", {}).get("nodes", [])),
                    "vnfs": sum(len(n.get("vnfs", [])) for n in st.get("topology", {}).get("nodes", [])),
                    "standalone": st.get("standalone"), "topology_file": st.get("topology_file")})
    return out


def install_certificate(pki: Pki, name: str, kind: str, dpids, ovs: OvsInstance, mgmt_ip: str) -> Path:
    """Issue `name`'s key and certificate and hand them to its OVS, as an operator would copy them to
    the node: its own directory (0700) with its key, its certificate and the controller CA it trusts.
    The node's OVSDB then serves TLS only on the management address."""
    files = pki.issue(name, kind, dpids)
    dest = Path(ovs.rundir) / "pki"
    dest.mkdir(mode=0o700, exist_ok=True)
    for src, dst, mode in ((files.key, "privkey.pem", 0o600), (files.cert, "cert.pem", 0o644),
                           (files.trust, "cacert.pem", 0o644)):
        tmp = dest / (dst + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(Path(src).read_bytes())
        tmp.replace(dest / dst)
    ovs.vsctl("set-ssl", str(dest / "privkey.pem"), str(dest / "cert.pem"), str(dest / "cacert.pem"),
              "--", *manager_commands(f"pssl:6640:{mgmt_ip}"))
    return dest


def _supervisor_status(rundir: str) -> dict | None:
    """Whether the node's supervisor runs, and per daemon its state, restarts and last exit."""
    state = supervised_state(Path(rundir))
    if state is None:
        return None
    return {"running": state["running"], "pid": state.get("pid"),
            "daemons": {name: {k: u.get(k) for k in ("state", "pid", "restarts", "last_exit")}
                        for name, u in state.get("units", {}).items()}}


def _reachable_from_nodes(url: str, root_ip: str) -> str:
    """`url` as the nodes' namespaces reach it: their loopback is their own, so a loopback host
    becomes the management bridge's address in the root namespace."""
    from urllib.parse import urlsplit, urlunsplit
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host == "localhost" or host.startswith("127.") or host == "::1":
        netloc = f"{root_ip}:{parts.port}" if parts.port else root_ip
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def hosts_m_fabric(cidr: str) -> ipaddress.IPv4Address:
    """The fabric switch's management address: the host just below the first node's."""
    return list(ipaddress.IPv4Network(cidr).hosts())[8]


def _free_mgmt_subnet() -> ipaddress.IPv4Network:
    used = set()
    for lab in list_labs():
        cidr = Lab(lab["name"]).state().get("management", {}).get("cidr")
        if cidr:
            used.add(ipaddress.IPv4Network(cidr))
    for a in json.loads(run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]"):
        for info in a.get("addr_info", []):
            used.add(ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network)
    for candidate in MGMT_POOL.subnets(new_prefix=24):
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise LabError(f"no free management /24 left in {MGMT_POOL}")


def _add_netns(ns: str) -> None:
    run(["ip", "netns", "add", ns])
    run(["ip", "link", "set", "lo", "up"], ns=ns)


def _prepare_veth_end(ns: str, dev: str) -> None:
    # OVS reads veths through AF_PACKET, which sees packets before the checksum is filled in:
    # with TX checksum offload on, TCP segments would leave with bad checksums.
    run(["ethtool", "-K", dev, "tx", "off"], ns=ns)
    run(["ip", "link", "set", dev, "up"], ns=ns)


def _hybrid_bridge(ns: str, name: str) -> None:
    """os-vif's hybrid plugging behind `tap<name>`: a Linux bridge `qbr<name>` holding it and
    `qvb<name>`, whose veth peer `qvo<name>` is left for br-int. MTUs follow the tap's; TX checksum
    offload off on the veth ends OVS reads (as for every VM veth of the lab)."""
    tap, qbr, qvb, qvo = (f"{p}{name}" for p in ("tap", "qbr", "qvb", "qvo"))
    mtu = str(json.loads(run(["ip", "-j", "link", "show", "dev", tap], ns=ns).stdout)[0]["mtu"])
    run(["ip", "link", "add", qbr, "mtu", mtu, "type", "bridge", "stp_state", "0", "forward_delay", "0"], ns=ns)
    run(["ip", "link", "add", qvb, "mtu", mtu, "type", "veth", "peer", "name", qvo, "mtu", mtu], ns=ns)
    run(["ip", "link", "set", tap, "master", qbr], ns=ns)
    run(["ip", "link", "set", qvb, "master", qbr], ns=ns)
    for dev in (qvb, qvo):
        _prepare_veth_end(ns, dev)
    run(["ip", "link", "set", qbr, "up"], ns=ns)


def _standalone_tag(topo: Topology, network: str) -> int:
    net = topo.network(network)
    if net.type == "vlan":
        return topo.segmentation_id(net)
    if net.type == "flat":
        raise LabError(f"network {network}: flat networks need the controller (no --standalone)")
    return 4000 + topo.networks.index(net)  # a local tag per VXLAN network, never on the wire


def _mac(kind: int, index: int) -> str:
    return f"02:{kind:02x}:00:00:{index >> 8:02x}:{index & 0xff:02x}"


def _pids_under(directory: Path) -> list[int]:
    """Pids from the pid files below a lab's run dir whose process is still alive."""
    pids = []
    if directory.exists():
        for pidfile in directory.glob("**/*.pid"):
            try:
                pid = int(pidfile.read_text().strip())
                if not process_running(pid):
                    continue
                # only a process started for this lab: its command line names the run dir
                if str(directory) in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "):
                    pids.append(pid)
            except (OSError, ValueError):
                pass
    return pids
