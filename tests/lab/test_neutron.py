"""A real Neutron drives fathom: ML2 + L3 drivers of networking-fathom, tested end to end.

One lab (three nodes, fathom's controller, no VM of its own), one Neutron API server from PyPI
(gunicorn, SQLite, noauth; fathom/lab/neutron.py) configured with `mechanism_drivers = fathom` and
fathom's L3 providers, authenticated to fathom with a `service` token. openstacksdk and the
`openstack` command line drive Neutron; VMs are plugged into the lab for Neutron ports with
`fathom lab plug --neutron-port`, and ping each other through fathom's datapath. Neutron's security
groups are enforced by fathom (a rule added in Neutron lets pings through that were dropped), a
networking-sfc port chain steers a VM's traffic into a VNF's port, a TaaS flow copies to a monitor, a
floating IP on an external network made in Neutron is reached from the lab's upstream host.
Then fathom's controller is killed during writes: Neutron keeps answering, and the journal and the
full sync bring fathom back to exactly Neutron's state.
"""
from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import pytest

from fathom.client import Client
from fathom.lab import controller as ctl
from fathom.lab.capture import Capture, read_pcap_ns

from fathom.lab.neutron import TOPOLOGY, UPSTREAM_MAC, NeutronServer, Sdk, available
from .util import ping, running_lab

pytestmark = pytest.mark.lab

LAB = "nu1"
FATHOM = str(Path(sys.executable).with_name("fathom"))


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    why = available()
    if why:
        pytest.fail(why)     # scripts/setup builds it: never a silent skip
    with running_lab(LAB, TOPOLOGY, standalone=False) as lab:
        admin = Client.for_lab(lab.state())
        token = admin.post("/tokens", json={"project_id": "services", "roles": ["service"], "name": "neutron"})["token"]
        server = NeutronServer(tmp_path_factory.mktemp("neutron"), lab.state()["controller"]["url"], token,
                               sync_interval=4).start()
        sdk = Sdk(server.url)
        try:
            yield lab, server, sdk, admin
        finally:
            sdk.close()
            server.stop()
            admin.close()


def plug(lab, port_id: str, vm: str) -> dict:
    out = subprocess.run([FATHOM, "lab", "plug", "-n", lab.name, "--neutron-port", port_id, "--vm", vm, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait_for(what: str, check, timeout: float = 30.0, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout} s")
        time.sleep(interval)


def fathom_by_external(admin: Client, collection: str, uuid: str) -> dict | None:
    found = admin.list(f"/{collection}", params={"external_id": uuid})
    return found[0] if found else None


def pings(lab, src: str, dst_ip: str) -> bool:
    """`src` reaches `dst_ip`: within 15 s, one ping of three answered (the first packets of a new
    path may be lost while the last switch takes its flows; a path that never works fails)."""
    return bool(wait_for(f"{src} -> {dst_ip}", lambda: ping(lab, src, dst_ip, count=3).returncode == 0, timeout=15))


def neutron_port_status(sdk: Sdk, port_id: str) -> str:
    return sdk.call("network.get_port", port_id)["status"]


def test_sdk_networks_router_ports_and_pings(cloud):
    lab, server, sdk, admin = cloud
    blue = sdk.call("network.create_network", name="blue")
    blue4 = sdk.call("network.create_subnet", network_id=blue["id"], cidr="10.10.1.0/24", ip_version=4, name="blue4",
                     dns_nameservers=["198.18.0.53"],
                     host_routes=[{"destination": "198.18.100.0/24", "nexthop": "10.10.1.254"},
                                  {"destination": "198.18.101.0/24", "nexthop": "192.0.2.1"}])
    red = sdk.call("network.create_network", name="red")
    red4 = sdk.call("network.create_subnet", network_id=red["id"], cidr="10.10.2.0/24", ip_version=4, name="red4")
    router = sdk.call("network.create_router", name="r1")
    sdk.call("network.add_interface_to_router", router["id"], subnet_id=blue4["id"])
    sdk.call("network.add_interface_to_router", router["id"], subnet_id=red4["id"])
    # more ports than the driver has status waiters, bound and never plugged (VMs whose node never
    # plugs them): they must not hold back the status of the ports below
    stuck = [sdk.call("network.create_port", network_id=blue["id"], name=f"stuck{i}", binding_host_id="compute1",
                      device_owner="compute:nova", device_id=f"vm-stuck{i}") for i in range(9)]
    ports = {name: sdk.call("network.create_port", network_id=net["id"], name=name, binding_host_id=host,
                            device_owner="compute:nova", device_id=f"vm-{name}")
             for name, net, host in (("a1", blue, "compute1"), ("a2", blue, "compute2"), ("b1", red, "compute2"))}

    # fathom holds every object under Neutron's UUID, with Neutron's segment, addresses and MACs
    net = wait_for("blue in fathom", lambda: fathom_by_external(admin, "networks", blue["id"]))
    assert (net["type"], net["segmentation_id"], net["project_id"]) == (
        blue["provider_network_type"], blue["provider_segmentation_id"], blue["project_id"])
    for name, port in ports.items():
        mine = wait_for(f"port {name} bound in fathom", lambda: (lambda x: x if x and x["node"] else None)(
            fathom_by_external(admin, "ports", port["id"])))
        assert mine["mac_address"] == port["mac_address"]
        assert [f["ip_address"] for f in mine["fixed_ips"]] == [f["ip_address"] for f in port["fixed_ips"]]
        assert (mine["node"], mine["interface_name"]) == (port["binding_host_id"], "tap" + port["id"][:11])
    # DHCP options as Neutron gives them; a route whose next hop is off the subnet is left out
    sub = wait_for("blue4 in fathom", lambda: fathom_by_external(admin, "subnets", blue4["id"]))
    assert (sub["enable_dhcp"], sub["dns_nameservers"]) == (True, ["198.18.0.53"])
    assert sub["host_routes"] == [{"destination": "198.18.100.0/24", "nexthop": "10.10.1.254"}]
    r = wait_for("r1's interfaces in fathom", lambda: (lambda x: x if x and len(x["interfaces"]) == 2 else None)(
        fathom_by_external(admin, "routers", router["id"])))
    assert r["mode"] == "distributed"
    assert {i["ip_address"] for i in r["interfaces"]} == {"10.10.1.1", "10.10.2.1"}

    # bound but no VIF yet: DOWN in Neutron (no port turns ACTIVE before its datapath carries it)
    assert {neutron_port_status(sdk, p["id"]) for p in ports.values()} == {"DOWN"}
    for name, port in ports.items():
        plug(lab, port["id"], name)
    for name, port in ports.items():
        wait_for(f"{name} ACTIVE in Neutron", lambda: neutron_port_status(sdk, port["id"]) == "ACTIVE", timeout=15)
        # by its status waiter, not only by the periodic full sync
        wait_for(f"{name}'s status waiter done", lambda: f"port {port['id']} is active" in server.log(), timeout=30)
    assert {neutron_port_status(sdk, p["id"]) for p in stuck} == {"DOWN"}
    for p in stuck:
        sdk.call("network.delete_port", p["id"])

    ip = {name: p["fixed_ips"][0]["ip_address"] for name, p in ports.items()}
    assert pings(lab, "a1", ip["a2"])          # same subnet, across nodes
    assert pings(lab, "a1", ip["b1"])          # across subnets, routed by fathom
    assert pings(lab, "b1", ip["a1"])


def test_taas_tap_flow_copies_to_the_tap_service(cloud):
    """TaaS: a tap service on a monitor VM's port, a tap flow (direction OUT) on a2 (on the other
    node): the monitor receives a2's echo requests, unchanged, across the tunnel. Then flows IN and
    BOTH: the monitor sees what they tap, once per flow, and the full sync repairs a deleted one."""
    lab, server, sdk, admin = cloud
    blue = sdk.call("network.find_network", "blue")
    mon = sdk.call("network.create_port", network_id=blue["id"], name="mon", binding_host_id="compute1",
                   device_owner="compute:nova")
    wait_for("mon bound in fathom", lambda: (lambda x: x if x and x["node"] else None)(
        fathom_by_external(admin, "ports", mon["id"])))
    plug(lab, mon["id"], "mon")
    wait_for("mon ACTIVE", lambda: neutron_port_status(sdk, mon["id"]) == "ACTIVE")
    a1, a2 = sdk.call("network.find_port", "a1"), sdk.call("network.find_port", "a2")
    service = sdk.call("network.create_tap_service", name="ids", port_id=mon["id"])
    flow = sdk.call("network.create_tap_flow", name="a2-out", tap_service_id=service["id"],
                    source_port=a2["id"], direction="OUT")
    policy = wait_for("the tap policy in fathom", lambda: fathom_by_external(admin, "taps", flow["id"]))
    assert (policy["sender"]["port_id"], policy["monitor"]["port_id"], policy["receiver"]["mac"]) == (
        fathom_by_external(admin, "ports", a2["id"])["id"], fathom_by_external(admin, "ports", mon["id"])["id"], "*")
    admin.wait_status("taps", policy["id"], timeout=20)
    a1_ip, a2_ip = a1["fixed_ips"][0]["ip_address"], a2["fixed_ips"][0]["ip_address"]
    out = icmp_at(lab, "mon", a1_ip, lambda: ping(lab, "a2", a1_ip, count=5))
    assert out.count((a2_ip, a1_ip, REQUEST)) >= 3, out
    sdk.call("network.delete_tap_flow", flow["id"])
    wait_for("the tap policy gone", lambda: fathom_by_external(admin, "taps", flow["id"]) is None)

    # IN on a1 (the monitor's node) and BOTH on a2 (the other node), both to the same tap service
    inbound = sdk.call("network.create_tap_flow", name="a1-in", tap_service_id=service["id"],
                       source_port=a1["id"], direction="IN")
    both = sdk.call("network.create_tap_flow", name="a2-both", tap_service_id=service["id"],
                    source_port=a2["id"], direction="BOTH")
    ports = {fathom_by_external(admin, "ports", x["id"])["id"]: x["name"] for x in (a1, a2)}
    shape = {}
    for f in (inbound, both):
        p = wait_for(f"the {f['direction']} policy in fathom", lambda f=f: fathom_by_external(admin, "taps", f["id"]))
        admin.wait_status("taps", p["id"], timeout=20)
        shape[f["direction"]] = (ports.get(p["sender"]["port_id"], p["sender"]["mac"]),
                                 ports.get(p["receiver"]["port_id"], p["receiver"]["mac"]), p["direction"])
        assert sdk.call("network.get_tap_flow", f["id"])["status"] != "ERROR"
    assert shape == {"IN": ("*", "a1", "forward"), "BOTH": ("a2", "*", "both")}
    # a1 pings a2: a2 receives the requests (BOTH, tapped at compute2's egress to a2, copies carried
    # to compute1) and sends the replies (BOTH at a2's ingress), which a1 receives (IN): one copy per
    # policy, so the monitor sees each request once and each reply twice
    out = icmp_at(lab, "mon", a1_ip, lambda: ping(lab, "a1", a2_ip, count=4))
    assert (out.count((a1_ip, a2_ip, REQUEST)), out.count((a2_ip, a1_ip, REPLY))) == (4, 8), out
    # drift: the IN policy deleted in fathom behind Neutron's back comes back as it was from the full sync
    admin.delete(f"/taps/{fathom_by_external(admin, 'taps', inbound['id'])['id']}")
    back = wait_for("the IN policy recreated by the full sync",
                    lambda: fathom_by_external(admin, "taps", inbound["id"]), timeout=20)
    assert (back["sender"]["mac"], ports.get(back["receiver"]["port_id"])) == ("*", "a1")
    time.sleep(9)                               # two full syncs: they find nothing to change
    assert fathom_by_external(admin, "taps", inbound["id"])["id"] == back["id"]
    admin.wait_status("taps", back["id"], timeout=20)
    # a2 pings a1: the requests copied twice (BOTH at a2's ingress, IN at a1's egress), the replies once
    out = icmp_at(lab, "mon", a1_ip, lambda: ping(lab, "a2", a1_ip, count=3))
    assert (out.count((a2_ip, a1_ip, REQUEST)), out.count((a1_ip, a2_ip, REPLY))) == (6, 3), out
    for f in (inbound, both):
        sdk.call("network.delete_tap_flow", f["id"])
        wait_for("the tap policy gone", lambda f=f: fathom_by_external(admin, "taps", f["id"]) is None)
    sdk.call("network.delete_tap_service", service["id"])


REQUEST, REPLY = 8, 0     # ICMP echo types


def icmp_at(lab, vm: str, host: str, make_traffic, answered: bool = True) -> list[tuple[str, str, int]]:
    """(source, destination, ICMP type) of each ICMP packet to or from `host` seen in `vm` while
    `make_traffic` runs (`answered`: and it succeeds). Read here, not by tshark: its start-up
    costs seconds on a busy machine, and these are plain IPv4 frames."""
    with TemporaryDirectory() as tmp:
        with Capture(lab.ns(vm), "eth0", Path(tmp) / "icmp.pcap", f"icmp and host {host}", nano=True) as cap:
            done = make_traffic()
            assert done.returncode == 0 or not answered, done.stdout
        frames = read_pcap_ns(cap.path)
    return [(socket.inet_ntoa(f[26:30]), socket.inet_ntoa(f[30:34]), f[14 + (f[14] & 0x0F) * 4])
            for _, f in frames if f[12:14] == b"\x08\x00" and f[23] == 1]     # IPv4, ICMP


def bound_port(sdk: Sdk, admin: Client, network_id: str, name: str, host: str, **extra) -> dict:
    extra.setdefault("device_id", f"vm-{name}")
    port = sdk.call("network.create_port", network_id=network_id, name=name, binding_host_id=host,
                    device_owner="compute:nova", **extra)
    wait_for(f"{name} bound in fathom", lambda: (lambda x: x if x and x["node"] else None)(
        fathom_by_external(admin, "ports", port["id"])))
    return port


def test_security_group_rule_takes_effect(cloud):
    """A VM in a Neutron group `web` without ingress rules: a2's pings and TCP connections to it are
    dropped by fathom; a rule (ingress ICMP) added in Neutron lets pings through, TCP stays dropped;
    deleting the rule drops pings again. Neutron's default group (a2's) is fathom's default group,
    adopted under Neutron's UUID with Neutron's rules."""
    lab, server, sdk, admin = cloud
    blue = sdk.call("network.find_network", "blue")
    web = sdk.call("network.create_security_group", name="web", description="web servers")
    # with Neutron's two rules of a new group (egress IPv4 and IPv6, anywhere)
    mine = wait_for("web and its rules in fathom", lambda: (lambda g: g if g and len(g["rules"]) == 2 else None)(
        fathom_by_external(admin, "security-groups", web["id"])))
    assert (mine["name"], mine["description"]) == ("web", "web servers")
    assert {r["direction"] for r in mine["rules"]} == {"egress"}
    w1 = bound_port(sdk, admin, blue["id"], "w1", "compute1", security_group_ids=[web["id"]])
    fathom_w1 = fathom_by_external(admin, "ports", w1["id"])
    assert fathom_w1["security_groups"] == [mine["id"]]
    default = sdk.call("network.find_security_group", "default", project_id=blue["project_id"])
    adopted = fathom_by_external(admin, "security-groups", default["id"])
    assert adopted["name"] == "default"
    assert sorted(r["external_id"] for r in adopted["rules"]) == sorted(r["id"] for r in default["security_group_rules"])
    plug(lab, w1["id"], "w1")
    wait_for("w1 ACTIVE", lambda: neutron_port_status(sdk, w1["id"]) == "ACTIVE")
    w1_ip = w1["fixed_ips"][0]["ip_address"]
    argv, env = lab.exec_args("w1", ["nc", "-l", "-k", "8080"])
    listener = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _web_rule(lab, sdk, admin, web, mine, w1_ip)
    finally:
        listener.kill()
        listener.wait(5)


def _web_rule(lab, sdk, admin, web, mine, w1_ip):
    admin.wait_status("security-groups", mine["id"], timeout=20)
    assert ping(lab, "a2", w1_ip, count=2).returncode != 0
    assert nc(lab, "a2", w1_ip, 8080) != 0

    rule = sdk.call("network.create_security_group_rule", security_group_id=web["id"], direction="ingress",
                    ethertype="IPv4", protocol="icmp")
    wait_for("the rule in fathom", lambda: fathom_by_external(admin, "security-group-rules", rule["id"]))
    admin.wait_status("security-groups", mine["id"], timeout=20)
    assert pings(lab, "a2", w1_ip)
    assert nc(lab, "a2", w1_ip, 8080) != 0       # only ICMP was allowed

    sdk.call("network.delete_security_group_rule", rule["id"])
    wait_for("the rule gone from fathom",
             lambda: fathom_by_external(admin, "security-group-rules", rule["id"]) is None)
    admin.wait_status("security-groups", mine["id"], timeout=20)
    assert ping(lab, "a2", w1_ip, count=2).returncode != 0


def nc(lab, src: str, ip: str, port: int) -> int:
    """Exit status of a TCP connection attempt from `src` (0: connected)."""
    argv, env = lab.exec_args(src, ["nc", "-z", "-w", "2", ip, str(port)])
    return subprocess.run(argv, env=env, capture_output=True, timeout=10).returncode


def test_port_chain_steers_into_the_vnf(cloud):
    """networking-sfc: a VNF with two ports (port security off) on compute2, a port pair, a group, a
    flow classifier (ICMP from a1 to b1) and a chain, all made through Neutron: tcpdump at the VNF's
    ingress sees a1's echo requests to b1, which without the chain went straight to b1."""
    lab, server, sdk, admin = cloud
    blue = sdk.call("network.find_network", "blue")
    a1, b1 = sdk.call("network.find_port", "a1"), sdk.call("network.find_port", "b1")
    vnf = {side: bound_port(sdk, admin, blue["id"], f"vnf-{side}", "compute2", port_security_enabled=False,
                            device_id="vm-vnf")        # one VM's two ports (networking-sfc checks)
           for side in ("in", "out")}
    for side, port in vnf.items():
        plug(lab, port["id"], f"vnf{side}")
    pair = sdk.call("network.create_sfc_port_pair", name="pp1", ingress=vnf["in"]["id"], egress=vnf["out"]["id"])
    group = sdk.call("network.create_sfc_port_pair_group", name="ppg1", port_pairs=[pair["id"]])
    b1_ip = b1["fixed_ips"][0]["ip_address"]
    classifier = sdk.call("network.create_sfc_flow_classifier", name="icmp-to-b1", ethertype="IPv4",
                          protocol="icmp", logical_source_port=a1["id"], destination_ip_prefix=f"{b1_ip}/32")
    chain = sdk.call("network.create_sfc_port_chain", name="pc1", port_pair_groups=[group["id"]],
                     flow_classifiers=[classifier["id"]])
    mine = wait_for("the chain in fathom", lambda: fathom_by_external(admin, "sfc/port_chains", chain["id"]))
    assert mine["port_pair_groups"] == [fathom_by_external(admin, "sfc/port_pair_groups", group["id"])["id"]]
    assert mine["flow_classifiers"] == [fathom_by_external(admin, "sfc/flow_classifiers", classifier["id"])["id"]]
    admin.wait_status("sfc/port_chains", mine["id"], timeout=30)

    a1_ip = a1["fixed_ips"][0]["ip_address"]
    # steered into the VNF (which does not forward): no replies
    out = icmp_at(lab, "vnfin", b1_ip, lambda: ping(lab, "a1", b1_ip, count=3), answered=False)
    assert out.count((a1_ip, b1_ip, REQUEST)) >= 2, out

    sdk.call("network.delete_sfc_port_chain", chain["id"])
    wait_for("the chain gone from fathom", lambda: fathom_by_external(admin, "sfc/port_chains", chain["id"]) is None)
    for kind, obj in (("flow_classifier", classifier), ("port_pair_group", group), ("port_pair", pair)):
        sdk.call(f"network.delete_sfc_{kind}", obj["id"])
    wait_for("the pair gone from fathom", lambda: fathom_by_external(admin, "sfc/port_pairs", pair["id"]) is None)
    assert pings(lab, "a1", b1_ip)            # unsteered again


def test_floating_ip_from_the_upstream_host(cloud):
    """An external network made in Neutron (VLAN 300, router:external) becomes fathom's external
    network; router r1's external gateway on it is fathom's router gateway (Neutron's address, SNAT);
    a floating IP associated with a1 is reached from the upstream host (the provider router, wired
    to the gateway node's ext0), moved to a2 it reaches a2, disassociated it reaches nothing."""
    lab, server, sdk, admin = cloud
    ext = sdk.call("network.create_network", name="ext", is_router_external=True, provider_network_type="vlan",
                   provider_physical_network="physnet1", provider_segmentation_id=300)
    sdk.call("network.create_subnet", network_id=ext["id"], cidr="203.0.113.0/24", ip_version=4,
             gateway_ip="203.0.113.1", is_dhcp_enabled=False, name="ext4")
    mine = wait_for("ext in fathom", lambda: fathom_by_external(admin, "networks", ext["id"]))
    assert (mine["external"], mine["upstream_mac"], mine["segmentation_id"]) == (True, UPSTREAM_MAC, 300)
    lab.wire_upstream(lab.node("gw"), "up", UPSTREAM_MAC, "203.0.113.1/24", 300)

    router = sdk.call("network.find_router", "r1")
    router = sdk.call("network.update_router", router["id"], external_gateway_info={"network_id": ext["id"]})
    gw_ip = router["external_gateway_info"]["external_fixed_ips"][0]["ip_address"]
    r = wait_for("r1's gateway in fathom", lambda: (lambda x: x if x and x["external_gateway"] else None)(
        fathom_by_external(admin, "routers", router["id"])))
    assert (r["external_gateway"]["ip_address"], r["external_gateway"]["enable_snat"]) == (gw_ip, True)
    # a router made with its gateway (Neutron sets it after the router's own transaction), SNAT off
    r2 = sdk.call("network.create_router", name="r2",
                  external_gateway_info={"network_id": ext["id"], "enable_snat": False})
    r2_ip = r2["external_gateway_info"]["external_fixed_ips"][0]["ip_address"]
    got = wait_for("r2's gateway in fathom", lambda: (lambda x: x["external_gateway"] if x else None)(
        fathom_by_external(admin, "routers", r2["id"])))
    assert (got["ip_address"], got["enable_snat"]) == (r2_ip, False)
    sdk.call("network.delete_router", r2["id"])
    wait_for("r2 gone from fathom", lambda: fathom_by_external(admin, "routers", r2["id"]) is None)

    # the VMs' group (the project's default) admits ICMP from the provider's network
    default = sdk.call("network.find_security_group", "default", project_id=ext["project_id"])
    rule = sdk.call("network.create_security_group_rule", security_group_id=default["id"], direction="ingress",
                    ethertype="IPv4", protocol="icmp", remote_ip_prefix="203.0.113.0/24")
    wait_for("the rule in fathom", lambda: fathom_by_external(admin, "security-group-rules", rule["id"]))
    a1, a2 = sdk.call("network.find_port", "a1"), sdk.call("network.find_port", "a2")
    fip = sdk.call("network.create_ip", floating_network_id=ext["id"], port_id=a1["id"])
    address = fip["floating_ip_address"]

    def fathom_fip(port: str | None):
        want = fathom_by_external(admin, "ports", port)["id"] if port else None
        f = fathom_by_external(admin, "floatingips", fip["id"])
        return f if f and f["port_id"] == want else None

    f = wait_for("the floating IP on a1 in fathom", lambda: fathom_fip(a1["id"]))
    assert f["floating_ip_address"] == address
    admin.wait_status("floatingips", f["id"], timeout=30)
    assert pings(lab, "up", address)
    assert _echo_requests_at(lab, "a1", address, count=3) >= 2

    sdk.call("network.update_ip", fip["id"], port_id=a2["id"])          # move
    f = wait_for("the floating IP moved to a2 in fathom", lambda: fathom_fip(a2["id"]))
    admin.wait_status("floatingips", f["id"], timeout=30)
    assert pings(lab, "up", address)
    assert _echo_requests_at(lab, "a2", address, count=3) >= 2

    sdk.call("network.update_ip", fip["id"], port_id=None)              # disassociate
    wait_for("the floating IP disassociated in fathom", lambda: fathom_fip(None))
    # a pass that read the disassociation wrote its status after its flows left the gateway node
    admin.wait_status("floatingips", f["id"], timeout=30)
    assert ping(lab, "up", address, count=2).returncode != 0


def _echo_requests_at(lab, vm: str, address: str, count: int) -> int:
    """Echo requests from the upstream host that `vm` receives while the upstream sends `count` to
    `address` (the floating IP, translated to the VM's fixed address on the way)."""
    seen = icmp_at(lab, vm, "203.0.113.1", lambda: ping(lab, "up", address, count=count), answered=False)
    return sum(1 for src, _, kind in seen if (src, kind) == ("203.0.113.1", REQUEST))


def test_openstack_cli_fabric_flavor(cloud):
    """The `openstack` command line: VLAN provider networks and a router of flavor fathom-fabric
    (routing in the top-of-rack switch), then everything deleted again. Subnets, router interfaces
    and ports through the SDK: each `openstack` call costs seconds on a busy machine, and
    docs/openstack.md runs those commands (tests/lab/test_docs.py)."""
    lab, server, sdk, admin = cloud
    cli = server.cli

    def made(*args):
        return json.loads(cli(*args, "-f", "json").stdout)

    profile = made("network", "flavor", "profile", "create", "--driver", "networking_fathom.l3.Fabric")
    flavor = made("network", "flavor", "create", "--service-type", "L3_ROUTER_NAT", "fathom-fabric")
    cli("network", "flavor", "add", "profile", flavor["id"], profile["id"])
    nets, subnets = {}, {}
    for name, vid, cidr in (("v120", 120, "10.20.0.0/24"), ("v130", 130, "10.30.0.0/24")):
        nets[name] = made("network", "create", "--provider-network-type", "vlan", "--provider-physical-network",
                          "physnet1", "--provider-segment", str(vid), name)
        subnets[name] = sdk.call("network.create_subnet", network_id=nets[name]["id"], cidr=cidr, ip_version=4,
                                 name=f"{name}-4")
    rf = made("router", "create", "--flavor", flavor["id"], "rf")
    for subnet in subnets.values():
        sdk.call("network.add_interface_to_router", rf["id"], subnet_id=subnet["id"])
    ports = {vm: sdk.call("network.create_port", network_id=nets[net]["id"], name=vm, binding_host_id=host,
                          device_owner="compute:nova")
             for vm, net, host in (("c1", "v120", "compute1"), ("c2", "v130", "compute2"))}
    mine = wait_for("rf with two interfaces in fathom", lambda: (lambda x: x if x and len(x["interfaces"]) == 2 else None)(
        fathom_by_external(admin, "routers", rf["id"])))
    assert mine["mode"] == "fabric"
    assert fathom_by_external(admin, "networks", nets["v120"]["id"])["segmentation_id"] == 120
    for vm, port in ports.items():
        wait_for(f"{vm} bound in fathom", lambda: (lambda x: x if x and x["node"] else None)(
            fathom_by_external(admin, "ports", port["id"])))
        plug(lab, port["id"], vm)
    for port in ports.values():
        wait_for("ACTIVE", lambda: neutron_port_status(sdk, port["id"]) == "ACTIVE")
    assert pings(lab, "c1", ports["c2"]["fixed_ips"][0]["ip_address"])

    for vm in ports:
        subprocess.run([FATHOM, "lab", "unplug", "-n", lab.name, vm], check=True, capture_output=True)
    for port in ports.values():
        sdk.call("network.delete_port", port["id"])
    for subnet in subnets.values():
        sdk.call("network.remove_interface_from_router", rf["id"], subnet_id=subnet["id"])
    sdk.call("network.delete_router", rf["id"])
    cli("network", "delete", *nets)
    wait_for("fabric objects gone from fathom", lambda: not any(
        fathom_by_external(admin, c, o["id"]) for c, o in
        [("routers", rf)] + [("networks", n) for n in nets.values()] + [("ports", p) for p in ports.values()]))


def journal_states(server: NeutronServer) -> dict[str, int]:
    with sqlite3.connect(server.dir / "neutron.db", timeout=30) as db:
        return dict(db.execute("SELECT state, count(*) FROM fathom_journal GROUP BY state").fetchall())


def journal_failures(server: NeutronServer) -> list[tuple]:
    with sqlite3.connect(server.dir / "neutron.db", timeout=30) as db:
        return db.execute("SELECT seq, object_type, operation, object_uuid, last_error FROM fathom_journal "
                          "WHERE state = 'failed'").fetchall()


def test_fathom_down_during_writes_then_resync(cloud):
    """Kill fathom's controller, write to Neutron (it answers: the journal keeps the writes), bring
    fathom back: every write arrives. Then drift in fathom itself (a Neutron object deleted behind
    Neutron's back, a stray one with a Neutron-looking id): the periodic full sync repairs both."""
    lab, server, sdk, admin = cloud
    try:
        _down_during_writes_then_resync(lab, server, sdk, admin)
    except Exception as e:     # what the driver logged says why
        raise AssertionError(f"{type(e).__name__}: {e}\njournal: {journal_states(server)}\n"
                             f"failed entries: {journal_failures(server)}\n"
                             f"{server.log_tail(60)}") from e


def _down_during_writes_then_resync(lab, server, sdk, admin):
    state = lab.state()["controller"]
    ctl.stop_controller(lab.dir)
    with pytest.raises(Exception):
        admin.get("/networks")
    green = sdk.call("network.create_network", name="green")
    green4 = sdk.call("network.create_subnet", network_id=green["id"], cidr="10.10.3.0/24", ip_version=4)
    g1 = sdk.call("network.create_port", network_id=green["id"], name="g1", binding_host_id="compute1",
                  device_owner="compute:nova")
    blue = sdk.call("network.find_network", "blue")
    sdk.call("network.update_network", blue["id"], name="blue-renamed")
    a2 = sdk.call("network.find_port", "a2")
    sdk.call("network.update_port", a2["id"], name="a2-renamed")
    late = sdk.call("network.create_security_group", name="late")
    ssh = sdk.call("network.create_security_group_rule", security_group_id=late["id"], direction="ingress",
                   ethertype="IPv4", protocol="tcp", port_range_min=22, port_range_max=22)
    time.sleep(1.5)                              # the journal thread has tried and found fathom down
    assert journal_states(server).get("pending", 0) >= 7

    restarted = ctl.start_controller(lab.dir, state["of_host"], state["api_port"], state["of_port"],
                                     pki_dir=state.get("pki_dir"))
    assert restarted["url"] == state["url"]
    # drained: nothing waiting, nor the last entry still being sent
    wait_for("journal drained", lambda: not {"pending", "processing"} & journal_states(server).keys(), timeout=40)
    assert journal_states(server).get("failed", 0) == 0
    assert fathom_by_external(admin, "networks", blue["id"])["name"] == "blue-renamed"
    assert fathom_by_external(admin, "ports", a2["id"])["name"] == "a2-renamed"
    assert fathom_by_external(admin, "subnets", green4["id"])["cidr"] == "10.10.3.0/24"
    assert fathom_by_external(admin, "ports", g1["id"])["node"] == "compute1"
    rule = fathom_by_external(admin, "security-group-rules", ssh["id"])
    assert (rule["security_group_id"], rule["protocol"], rule["port_range_min"]) == (
        fathom_by_external(admin, "security-groups", late["id"])["id"], "tcp", 22)

    # drift in fathom, both ways
    admin.delete(f"/ports/{fathom_by_external(admin, 'ports', g1['id'])['id']}")
    admin.delete(f"/security-group-rules/{rule['id']}")
    stray = admin.post("/networks", json={"name": "stray", "external_id": "00000000-0000-4000-8000-00000000beef",
                                          "project_id": green["project_id"]})
    wait_for("g1 recreated by the full sync", lambda: fathom_by_external(admin, "ports", g1["id"]), timeout=20)
    wait_for("the rule recreated by the full sync",
             lambda: fathom_by_external(admin, "security-group-rules", ssh["id"]), timeout=20)
    wait_for("stray network deleted by the full sync",
             lambda: fathom_by_external(admin, "networks", stray["external_id"]) is None, timeout=20)
    # the datapath still carries the VMs made before the outage
    a1 = sdk.call("network.find_port", "a1")
    b1 = sdk.call("network.find_port", "b1")
    assert pings(lab, "a1", a2["fixed_ips"][0]["ip_address"])
    assert pings(lab, "b1", a1["fixed_ips"][0]["ip_address"])
    assert b1["status"] == "ACTIVE"
