"""Where the agent puts a chain's PPTMon programs (fathom.agent.plugging): behind a hybrid-plugged
port on the VM-facing tap, on a directly plugged one only on OVS's kernel datapath, and nowhere on
the userspace datapath. The links are `ip -d -j link show` of a lab node (trimmed to the fields the
function reads): fw1 plugged hybrid, fwd directly, on netdev."""
from __future__ import annotations

from dataclasses import replace

from fathom.agent.plugging import vm_facing
from fathom.agent.pptmon import Pptmon
from fathom.model.hostlocal import PptmonAttach

NODE_LINKS = [
    {"ifindex": 2, "ifname": "mgmt0", "link_index": 2606, "mtu": 1500, "linkinfo": {"info_kind": "veth"}},
    {"ifindex": 3, "ifname": "ul0", "link_index": 5, "mtu": 1600, "linkinfo": {"info_kind": "veth"}},
    {"ifindex": 4, "ifname": "ovs-netdev", "mtu": 1500, "linkinfo": {"info_kind": "tun"}},
    {"ifindex": 5, "ifname": "br-phy", "mtu": 1600, "linkinfo": {"info_kind": "tun"}},
    {"ifindex": 6, "ifname": "br-int", "mtu": 1500, "linkinfo": {"info_kind": "tun"}},
    {"ifindex": 7, "ifname": "client", "link_index": 2, "mtu": 1500, "linkinfo": {"info_kind": "veth"}},
    {"ifindex": 8, "ifname": "tapfw1i", "link_index": 2, "master": "qbrfw1i", "mtu": 1500, "linkinfo": {"info_kind": "veth", "info_slave_kind": "bridge"}},
    {"ifindex": 9, "ifname": "qbrfw1i", "mtu": 1500, "linkinfo": {"info_kind": "bridge"}},
    {"ifindex": 10, "ifname": "qvofw1i", "link": "qvbfw1i", "mtu": 1500, "linkinfo": {"info_kind": "veth"}},
    {"ifindex": 11, "ifname": "qvbfw1i", "link": "qvofw1i", "master": "qbrfw1i", "mtu": 1500, "linkinfo": {"info_kind": "veth", "info_slave_kind": "bridge"}},
    {"ifindex": 12, "ifname": "tapfw1o", "link_index": 3, "master": "qbrfw1o", "mtu": 1500, "linkinfo": {"info_kind": "veth", "info_slave_kind": "bridge"}},
    {"ifindex": 13, "ifname": "qbrfw1o", "mtu": 1500, "linkinfo": {"info_kind": "bridge"}},
    {"ifindex": 14, "ifname": "qvofw1o", "link": "qvbfw1o", "mtu": 1500, "linkinfo": {"info_kind": "veth"}},
    {"ifindex": 15, "ifname": "qvbfw1o", "link": "qvofw1o", "master": "qbrfw1o", "mtu": 1500, "linkinfo": {"info_kind": "veth", "info_slave_kind": "bridge"}},
    {"ifindex": 16, "ifname": "fwdi", "link_index": 2, "mtu": 1500, "linkinfo": {"info_kind": "veth"}},
    {"ifindex": 17, "ifname": "fwdo", "link_index": 3, "mtu": 1500, "linkinfo": {"info_kind": "veth"}}
]


def on_kernel_datapath(links: list[dict]) -> list[dict]:
    """The same node were fwd plugged into OVS's kernel datapath: their master is `ovs-system`."""
    out = [dict(link, master="ovs-system", linkinfo={"info_kind": "veth", "info_slave_kind": "openvswitch"})
           if link["ifname"] in ("fwdi", "fwdo") else link for link in links]
    return out + [{"ifindex": 99, "ifname": "ovs-system", "mtu": 1500, "linkinfo": {"info_kind": "openvswitch"}}]


def test_hybrid_plugging_puts_the_programs_on_the_tap():
    assert vm_facing("qvofw1i", "compute1", NODE_LINKS).interface == "tapfw1i"
    got = vm_facing("qvofw1o", "compute1", NODE_LINKS)
    assert (got.interface, got.plugging, got.reason) == ("tapfw1o", "hybrid", None)


def test_direct_plugging_works_on_the_kernel_datapath_only():
    got = vm_facing("fwdi", "compute1", NODE_LINKS)
    assert got.interface is None and got.plugging == "netdev"
    assert "node compute1 runs OVS's netdev datapath" in got.reason and "kernel datapath" in got.reason
    assert "fwdi" in got.reason
    got = vm_facing("fwdi", "compute1", on_kernel_datapath(NODE_LINKS))
    assert (got.interface, got.plugging) == ("fwdi", "kernel")


def test_a_bridge_with_other_ports_is_not_a_hybrid_plug_and_a_missing_interface_is_awaited():
    crowded = NODE_LINKS + [{"ifindex": 98, "ifname": "other", "master": "qbrfw1i", "linkinfo": {"info_kind": "veth"}}]
    assert vm_facing("qvofw1i", "compute1", crowded).plugging == "netdev"
    got = vm_facing("qvogone", "compute1", NODE_LINKS)
    assert got.plugging == "absent" and got.reason == "waiting for interface 'qvogone' on node compute1"


def test_the_handler_moves_a_chains_points_and_leaves_an_operators_alone(tmp_path):
    h = Pptmon(tmp_path / "records", tmp_path / "state", tmp_path / "bpffs", "compute1")
    chain = PptmonAttach(3, "port_chain:1", 1, "source", "qvofw1i:egress", "qvofw1o:ingress", 10**6, "port_chain_vnf")
    here, refused = h.placed(chain, NODE_LINKS)
    assert refused is None and (here.in_point, here.out_point) == ("tapfw1i:egress", "tapfw1o:ingress")
    assert replace(here, in_point=chain.in_point, out_point=chain.out_point) == chain
    direct = replace(chain, in_point="fwdi:egress", out_point="fwdo:ingress")
    here, refused = h.placed(direct, NODE_LINKS)
    assert here is None and refused["status"] == "error" and "netdev datapath" in refused["reason"]
    here, refused = h.placed(replace(chain, in_point="qvonew:egress"), NODE_LINKS)
    assert here is None and refused["status"] == "pending"
    operator = PptmonAttach(3, "op", 1, "source", "fwdi:egress", "fwdo:ingress", 10**6)
    assert h.placed(operator, NODE_LINKS) == (operator, None)
