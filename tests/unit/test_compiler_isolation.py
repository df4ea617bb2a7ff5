"""A tenant port bound to one of the fabric's own interfaces (the tunnel, the uplink, a patch port,
a bridge) must not be compiled: it would classify every tenant's traffic arriving there into its
network. Property-checked over random clouds with the flow simulator: whatever the attacker binds,
the compiled switches are exactly those of the cloud without it, every victim's frames still reach
exactly their destination, and nothing reaches the attacker's VM."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from fathom.apps.tenant import compiler as tenant
from fathom.pipeline.infrastructure import refused_ports
from fathom.model import FixedIp, Network, Port, Snapshot, Subnet, TapPolicy

from .flowsim import Fabric, compile_tenant
from .test_compiler_tenant import random_cloud

BCAST = "ff:ff:ff:ff:ff:ff"
ATTACK_NET = 99


def attacked(snap: Snapshot, rng: random.Random) -> tuple[Snapshot, Port, Port]:
    """The cloud plus an attacker project: a network, a VM on some node, and a port bound to a
    fabric interface of a node (by name, or by a name whose OpenFlow port number is the tunnel's)."""
    nodes = [n for n in snap.nodes if n.ofports]
    where = rng.choice(nodes)
    vm_node = rng.choice(nodes)
    vtype = rng.choice(["vxlan", "vlan"])
    net = Network(ATTACK_NET, "evil", "attacker", vtype, 4000 if vtype == "vxlan" else 4000 % 4094)
    sub = Subnet(ATTACK_NET * 10, "evil4", "attacker", ATTACK_NET, "10.66.0.0/24", "10.66.0.1")
    how = rng.choice(["vxlan0", "patch-phy", "br-int", "alias"])
    interface = "tap-evil" if how == "alias" else how
    trap = Port(9901, "trap", "attacker", ATTACK_NET, "02:66:00:00:00:01", (FixedIp(sub.id, "10.66.0.11"),),
                where.name, interface)
    vm = Port(9902, "evilvm", "attacker", ATTACK_NET, "02:66:00:00:00:02", (FixedIp(sub.id, "10.66.0.12"),),
              vm_node.name, "tap-evilvm")
    nodes = []
    for n in snap.nodes:
        ofports = dict(n.ofports)
        if n.name == vm_node.name:
            ofports["tap-evilvm"] = 99
        if how == "alias" and n.name == where.name:
            ofports["tap-evil"] = ofports["vxlan0"]       # an interface reported at the tunnel's number
        nodes.append(replace(n, ofports=ofports))
    out = replace(snap, nodes=tuple(nodes), networks=snap.networks + (net,), subnets=snap.subnets + (sub,),
                  ports=snap.ports + (trap, vm))
    return out, trap, vm


@pytest.mark.parametrize("seed", range(40))
def test_a_port_on_a_fabric_interface_changes_nothing(seed):
    rng = random.Random(1000 + seed)
    base = random_cloud(seed)
    snap, trap, vm = attacked(base, rng)
    refused = refused_ports(snap)
    assert set(refused) == {trap.id} and "refused" in refused[trap.id]
    states = compile_tenant(snap)
    # The trap is not compiled: every node's switch is the one of the cloud with only the
    # attacker's VM (no trap), flow for flow.
    without_trap = replace(snap, ports=tuple(p for p in snap.ports if p.id != trap.id))
    assert states == compile_tenant(without_trap)

    # (the simulator names a port by its number: give it the tunnel's own name back)
    sim = replace(snap, nodes=tuple(replace(n, ofports={k: v for k, v in n.ofports.items() if k != "tap-evil"})
                                    for n in snap.nodes))
    fabric = Fabric(sim, states)
    nodes = {n.name: n for n in snap.nodes}
    plugged = [p for p in base.ports if p.node and p.interface in nodes[p.node].ofports]
    for p in plugged:
        frames = [{"eth_dst": BCAST, "ipv4_dst": "10.0.0.255"}]
        frames += [{"eth_dst": q.mac_address, "ipv4_dst": q.fixed_ips[0].ip_address} for q in plugged]
        for frame in frames:
            got = fabric.send(p.node, p.interface, {"eth_src": p.mac_address, "eth_type": 0x0800,
                                                    "ipv4_src": p.fixed_ips[0].ip_address, "ttl": 64, **frame})
            # the attacker's VM sees nothing of any victim's traffic
            assert all((d.node, d.interface) != (vm.node, vm.interface) for d in got), (p, frame)
            dst = frame["eth_dst"]
            targets = [q for q in plugged if q.mac_address == dst and q.network_id == p.network_id and q is not p]
            if dst != BCAST and len(targets) == 1:
                # the victim's unicast still reaches exactly its port, across the tunnel or uplink
                assert [(d.node, d.interface) for d in got] == [(targets[0].node, targets[0].interface)]


def test_without_the_refusal_the_attack_would_capture_traffic(monkeypatch):
    """The property above can fail: with the refusal switched off, the trap on vxlan0 takes over the
    tunnel's classification and a victim's cross-node frames are lost to the attacker's network."""
    base = random_cloud(3)
    rng = random.Random(7)
    for _ in range(50):
        snap, trap, vm = attacked(base, rng)
        if trap.interface == "vxlan0":
            break
    monkeypatch.setattr(tenant, "refused_ports", lambda _snap, _views=None: {})
    states = compile_tenant(snap)
    without_trap = replace(snap, ports=tuple(p for p in snap.ports if p.id != trap.id))
    assert states != compile_tenant(without_trap)


@pytest.mark.parametrize("seed", range(10))
def test_no_app_compiles_the_trap(seed):
    """Every compiler the controller runs (compile_all): a tap policy whose sender is the trap port
    installs nothing (it would otherwise copy the tunnel's traffic to the attacker's monitor)."""
    from fathom.controller.desired import compile_switches
    base = random_cloud(seed)
    snap, trap, vm = attacked(base, random.Random(2000 + seed))
    tap = TapPolicy(1, "steal", "attacker", trap.id, None, False, "02:00:00:00:00:99", "10.0.0.99", (vm.id,))
    with_tap = replace(snap, tap_policies=(tap,))
    desired, refused = compile_switches(with_tap)
    assert set(refused) == {trap.id}
    assert desired == compile_switches(replace(snap, ports=tuple(p for p in snap.ports if p.id != trap.id)))[0]
