"""DHCP servers in the host-local desired state: which node runs which network's server, and
what each answers (static leases of that node's ports only, mask, router, MTU, routes, DNS)."""
from __future__ import annotations

from fathom.model.hostlocal_desired import desired, dhcp_servers
from fathom.model import FixedIp, Network, Node, Port, RouterInterface, Snapshot, Subnet
from fathom.model.hostlocal import DhcpServer, digest, from_json, to_json


def _snapshot(**subnet_extra) -> Snapshot:
    nodes = tuple(Node(i, f"c{i}", "compute", f"10.0.0.{i}", None) for i in (1, 2, 3))
    networks = (Network(10, "vx", "p1", "vxlan", 100), Network(11, "vl", "p2", "vlan", 200))
    subnet = {"dns_nameservers": ("192.0.2.53",), "host_routes": (("203.0.113.0/24", "198.19.1.9"),), **subnet_extra}
    subnets = (Subnet(20, "s-vx", "p1", 10, "198.19.1.0/24", "198.19.1.1", **subnet),
               Subnet(21, "s-vl", "p2", 11, "198.19.2.0/24", "198.19.2.1"))
    ports = (Port(30, "a", "p1", 10, "02:00:00:00:00:30", (FixedIp(20, "198.19.1.10"),), "c1", "tap30"),
             Port(31, "b", "p1", 10, "02:00:00:00:00:31", (FixedIp(20, "198.19.1.254"),), "c2", "tap31"),
             Port(32, "c", "p2", 11, "02:00:00:00:00:32", (FixedIp(21, "198.19.2.10"),), "c1", "tap32"),
             Port(33, "unbound", "p1", 10, "02:00:00:00:00:33", (FixedIp(20, "198.19.1.11"),)))
    ris = (RouterInterface(40, 1, 20, 10, "198.19.1.1", "02:00:00:00:00:40"),)
    return Snapshot(nodes=nodes, networks=networks, subnets=subnets, ports=ports, router_interfaces=ris)


def test_one_server_per_network_per_node_with_local_ports_only():
    out = dhcp_servers(_snapshot())
    assert sorted(out) == ["c1", "c2"]          # c3 has no port: no server
    c1 = {s.network_id: s for s in out["c1"]}
    assert sorted(c1) == [10, 11]
    vx = c1[10]
    assert [(h.mac, h.ip) for h in vx.hosts] == [("02:00:00:00:00:30", "198.19.1.10")]   # not c2's port
    assert vx.mtu == 1450 and c1[11].mtu == 1500
    (sub,) = vx.subnets
    # .254 is a port's address: the server takes the highest free one, the same on every node
    assert sub.server_address == "198.19.1.253/24"
    assert out["c2"][0].subnets[0].server_address == sub.server_address
    assert out["c2"][0].mac == vx.mac != c1[11].mac
    assert sub.gateway_ip == "198.19.1.1" and sub.dns_nameservers == ("192.0.2.53",)
    assert sub.host_routes == (("203.0.113.0/24", "198.19.1.9"),)


def test_a_server_answers_on_every_dhcp_subnet_of_its_network_and_no_other():
    base = _snapshot()
    extra = Subnet(22, "s-vx2", "p1", 10, "198.19.3.0/24", "198.19.3.1")
    out = dhcp_servers(Snapshot(nodes=base.nodes, networks=base.networks, subnets=(extra, *base.subnets),
                                ports=base.ports, router_interfaces=base.router_interfaces))
    c1 = {s.network_id: s for s in out["c1"]}
    assert [d.subnet_id for d in c1[10].subnets] == [20, 22]     # in subnet id order
    assert [d.subnet_id for d in c1[11].subnets] == [21]


def test_disabled_dhcp_means_no_server():
    out = dhcp_servers(_snapshot(enable_dhcp=False))
    assert [s.network_id for s in out["c1"]] == [11]
    assert "c2" not in out


def test_desired_carries_servers_and_the_wire_form_round_trips():
    objs = desired(_snapshot())
    servers = [o for o in objs["c1"] if isinstance(o, DhcpServer)]
    assert len(servers) == 2 and objs["c3"] == []
    for s in servers:
        assert from_json(to_json(s)) == s
    # a changed lease is a new revision
    snap = _snapshot()
    moved = Snapshot(nodes=snap.nodes, networks=snap.networks, subnets=snap.subnets,
                     ports=snap.ports[:1] + (Port(31, "b", "p1", 10, "02:00:00:00:00:31",
                                                  (FixedIp(20, "198.19.1.254"),), "c1", "tap31"),) + snap.ports[2:],
                     router_interfaces=snap.router_interfaces)
    assert digest(desired(moved)["c1"]) != digest(objs["c1"])


def test_br_int_sends_dhcp_requests_only_to_the_local_server_of_the_ports_network():
    from dataclasses import replace

    from fathom.apps.tenant.compiler import compile_tenant
    from fathom.openflow.spec import GotoTable, Output, SetField
    from fathom.pipeline import stages as st

    snap = _snapshot()
    # c1: VM ports tap30 (network 10), tap32 (network 11); only network 10 has its DHCP port here
    nodes = (replace(snap.nodes[0], ofports={"tap30": 1, "tap32": 2, "dhp10": 7, "vxlan0": 9}),) + snap.nodes[1:]
    flows = compile_tenant(replace(snap, nodes=nodes))["c1"].flows
    dhcp = [f for f in flows if f.table == st.SECURITY and dict(f.match).get("udp_dst") == 67]
    by_port = {dict(f.match)[st.REG_SRC_PORT]: f for f in dhcp}
    assert by_port[30].actions == (SetField(st.REG_OUT_PORT, 7), GotoTable(st.OUTPUT))
    assert by_port[32].actions == ()        # no server of network 11 on c1: dropped, never flooded
    # no DHCP request ever leaves through the tunnel: nothing in security sends it to l2
    assert all(GotoTable(st.L2) not in f.actions for f in dhcp)
    rogue = [f for f in flows if f.table == st.SECURITY and dict(f.match).get("udp_src") == 67]
    assert {dict(f.match)[st.REG_SRC_PORT] for f in rogue} == {30, 32} and all(f.actions == () for f in rogue)
    # the DHCP port enters network 10 (and only it) and is an output
    classify = [f for f in flows if f.table == st.CLASSIFY and dict(f.match).get("in_port") == 7]
    assert [f.actions[0] for f in classify] == [SetField(st.REG_NETWORK, 10)]
    assert any(f.table == st.OUTPUT and f.actions == (Output(7),) for f in flows)


def test_br_int_answers_arp_for_the_server_only_where_it_runs():
    from dataclasses import replace

    from fathom.apps.tenant.compiler import compile_tenant
    from fathom.pipeline import stages as st

    snap = _snapshot()
    nodes = (replace(snap.nodes[0], ofports={"tap30": 1, "dhp10": 7}),
             replace(snap.nodes[1], ofports={"tap31": 1}), snap.nodes[2])
    compiled = compile_tenant(replace(snap, nodes=nodes))

    def answers(node):
        return {dict(f.match).get("arp_tpa") for f in compiled[node].flows if f.table == st.ARP}
    assert "198.19.1.253" in answers("c1")       # the server address of subnet 20 (see above)
    assert "198.19.1.253" not in answers("c2")   # no DHCP port on c2: nothing claims the address


def test_dnsmasq_options_carry_every_field(tmp_path):
    """The agent's dnsmasq files (pure rendering; the lab test runs them): router, DNS servers,
    classless routes with the default route added once, MTU, static leases only."""
    from fathom.agent.dhcp import render
    (server,) = [s for s in dhcp_servers(_snapshot())["c1"] if s.network_id == 10]
    files = render(server, tmp_path)
    opts = files["opts"].splitlines()
    assert "option:mtu,1450" in opts
    assert "tag:s20,option:router,198.19.1.1" in opts
    assert "tag:s20,option:dns-server,192.0.2.53" in opts
    assert "tag:s20,option:classless-static-route,203.0.113.0/24,198.19.1.9,0.0.0.0/0,198.19.1.1" in opts
    assert "dhcp-range=set:s20,198.19.1.0,static,255.255.255.0,86400" in files["dnsmasq.conf"]
    assert files["hosts"].splitlines() == ["02:00:00:00:00:30,198.19.1.10,port-30,86400"]
    # a host route that is the default already: not added twice
    own_default = _snapshot(host_routes=(("0.0.0.0/0", "198.19.1.9"),))
    (server,) = [s for s in dhcp_servers(own_default)["c1"] if s.network_id == 10]
    assert "tag:s20,option:classless-static-route,0.0.0.0/0,198.19.1.9" in render(server, tmp_path)["opts"].splitlines()
