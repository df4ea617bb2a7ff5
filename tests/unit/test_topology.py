"""Topology parsing and every validation error, each naming the file, the line and the field."""
import textwrap

import pytest

from fathom.lab.topology import DEFAULT_TOPOLOGY, TopologyError, check_lab_name, load, parse

GOOD = textwrap.dedent("""\
    networks:
      - {name: blue, type: vxlan, segmentation_id: 1001, cidr: 198.19.1.0/24}
      - {name: red, type: vlan, cidr: 198.19.1.0/24}
    nodes:
      - name: c1
        vms:
          - {name: vm1, mac: "02:00:00:00:00:01", ip: 198.19.1.11/24, network: blue}
          - {name: vm2, mac: "02:00:00:00:00:01", ip: 198.19.1.11/24, network: red}
      - name: gw
        role: gateway
    """)


def problems(text: str) -> list[str]:
    with pytest.raises(TopologyError) as e:
        parse(text, "t.yaml")
    return e.value.lines()


def test_default_topology_has_two_computes_a_gateway_and_two_vms_each():
    topo = load(DEFAULT_TOPOLOGY)
    roles = [n.role for n in topo.nodes]
    assert roles.count("compute") == 2 and roles.count("gateway") == 1
    assert all(len(n.vms) == 2 for n in topo.nodes if n.role == "compute")


def test_overlapping_subnets_in_different_networks_are_fine():
    topo = parse(GOOD)
    assert [topo.segmentation_id(n) for n in topo.networks] == [1001, 101]
    assert str(topo.underlay.cidr) == "198.18.0.0/24"


def test_unknown_key_names_line_and_field():
    assert problems(GOOD.replace("    role: gateway", "    role: gateway\n    colour: red")) == \
        ["t.yaml:11: nodes[1].colour: unknown key"]


def test_duplicate_name():
    out = problems(GOOD.replace("name: gw", "name: vm1"))
    assert out == ["t.yaml:9: nodes[1].name: duplicate name 'vm1' (first at line 7)"]


def test_duplicate_key():
    assert problems("nodes: []\nnodes: []\n") == ["t.yaml:2: nodes: key 'nodes' given twice"]


def test_bad_cidr():
    out = problems(GOOD.replace("cidr: 198.19.1.0/24}\nnodes", "cidr: 198.19.1.1/24}\nnodes"))
    assert len(out) == 1 and out[0].startswith("t.yaml:3: networks[1].cidr:") and "host bits" in out[0]


def test_bad_mac():
    out = problems(GOOD.replace('"02:00:00:00:00:01", ip: 198.19.1.11/24, network: blue', '"02:00:00:zz", ip: 198.19.1.11/24, network: blue'))
    assert out == ["t.yaml:7: nodes[0].vms[0].mac: '02:00:00:zz' is not a MAC address like 02:00:00:00:00:01"]


def test_multicast_mac():
    out = problems(GOOD.replace('"02:00:00:00:00:01", ip: 198.19.1.11/24, network: blue', '"01:00:00:00:00:01", ip: 198.19.1.11/24, network: blue'))
    assert out and "multicast" in out[0] and out[0].startswith("t.yaml:7: nodes[0].vms[0].mac")


def test_ip_outside_subnet():
    out = problems(GOOD.replace("ip: 198.19.1.11/24, network: blue", "ip: 198.19.2.11/24, network: blue"))
    assert out == ["t.yaml:7: nodes[0].vms[0].ip: 198.19.2.11 is outside network blue's subnet 198.19.1.0/24"]


def test_duplicate_ip_and_mac_in_one_network():
    out = problems(GOOD.replace("network: red", "network: blue"))
    assert out == ["t.yaml:8: nodes[0].vms[1].ip: 198.19.1.11 already used in network blue (line 7)",
                   "t.yaml:8: nodes[0].vms[1].mac: 02:00:00:00:00:01 already used in network blue (line 7)"]


def test_unknown_network():
    out = problems(GOOD.replace("network: red", "network: green"))
    assert out == ["t.yaml:8: nodes[0].vms[1].network: unknown network 'green'"]


def test_segmentation_id_in_use_and_vlan_range():
    out = problems(GOOD.replace("type: vlan,", "type: vxlan, segmentation_id: 1001,"))
    assert out == ["t.yaml:3: networks[1].segmentation_id: segmentation id 1001 already used by network at line 2"]
    out = problems(GOOD.replace("type: vlan,", "type: vlan, segmentation_id: 5000,"))
    assert out == ["t.yaml:3: networks[1].segmentation_id: a VLAN id must be 1..4094"]


def test_bad_name_and_several_problems_at_once():
    out = problems(GOOD.replace("name: c1", "name: Compute_1").replace("role: gateway", "role: router"))
    assert [o.split(":")[1:3] for o in out] == [["5", " nodes[0].name"], ["10", " nodes[1].role"]]


def test_not_yaml_empty_and_missing_file(tmp_path):
    assert problems("nodes: [")[0].startswith("t.yaml:1: (document): not valid YAML")
    assert problems("") == ["t.yaml:1: (document): the file is empty"]
    with pytest.raises(TopologyError) as e:
        load(tmp_path / "nope.yaml")
    assert e.value.lines() == [f"{tmp_path / 'nope.yaml'}:?: (file): No such file or directory"]


def test_lab_names():
    check_lab_name("t2a")
    for bad in ("", "Lab", "a-b", "toolongname"):
        with pytest.raises(ValueError):
            check_lab_name(bad)


def test_vnfs_are_checked_like_vms():
    text = textwrap.dedent("""\
        networks:
          - {name: blue, cidr: 198.19.1.0/24}
        nodes:
          - name: c1
            vms:
              - {name: vm1, mac: "02:fa:00:00:01:01", ip: 198.19.1.11/24, network: blue}
            vnfs:
              - {name: fw, kind: nat, rules: 3, network: blue,
                 ingress: {mac: "02:fa:00:00:01:01", ip: 198.19.1.101/24},
                 egress: {mac: "02:fb:00:00:01:02", ip: 198.19.2.102/24}}
              - {name: vm1, kind: haproxy, network: red,
                 ingress: {mac: "02:fb:00:00:01:03", ip: 198.19.1.103/24},
                 egress: {mac: "02:fb:00:00:01:04", ip: 198.19.1.104/24}}
        """)
    with pytest.raises(TopologyError) as e:
        parse(text, "t.yaml")
    fields = {p.field for p in e.value.problems}
    assert fields == {"nodes[0].vnfs[0].rules", "nodes[0].vnfs[0].ingress.mac", "nodes[0].vnfs[0].egress.ip",
                      "nodes[0].vnfs[1].name", "nodes[0].vnfs[1].backend", "nodes[0].vnfs[1].network"}, e.value.lines()


def test_the_sfc_topology_loads():
    topo = load(DEFAULT_TOPOLOGY.parent / "sfc.yaml")
    assert [v.kind for _, v in topo.vnfs()] == ["firewall", "firewall", "dpi", "forward", "nat", "haproxy"]


def test_a_hybrid_plug_is_parsed_and_its_links_must_not_clash():
    topo = parse(GOOD.replace('network: blue}', 'network: blue, plug: hybrid}'))
    assert [vm.plug for _, vm in topo.vms()] == ["hybrid", "direct"]
    assert problems(GOOD.replace('network: blue}', 'network: blue, plug: bridged}'))[0].startswith(
        "t.yaml:7: nodes[0].vms[0].plug: Input should be")
    clash = GOOD.replace('network: blue}', 'network: blue, plug: hybrid}').replace(
        "{name: vm2,", "{name: tapvm1,")
    assert problems(clash) == ["t.yaml:8: nodes[0].vms[1].name: its interface 'tapvm1' clashes with one of line 7"]
