"""The DHCP servers kept from snapshot to snapshot (fathom.model.hostlocal_desired.DhcpServers) against the
same worked out from nothing, along a random walk of changes to ports, subnets and networks; and a
change to one port rebuilds only its servers, the others staying the very objects of the call
before (what the callers' digests and JSON, kept by object, rely on)."""
from __future__ import annotations

import random
from dataclasses import replace

from fathom.model.hostlocal_desired import Desired, DhcpServers, desired, dhcp_servers
from fathom.model import FixedIp, Network, Node, Port, Snapshot, Subnet
from fathom.model.views import Views

NODES = tuple(Node(i + 1, f"n{i}", "compute", f"198.18.0.{i + 1}", None) for i in range(4))


def _world():
    networks = [Network(k + 1, f"net{k}", "p", "vxlan" if k % 2 else "vlan", 100 + k) for k in range(4)]
    subnets = [Subnet(k + 1, f"s{k}", "p", k + 1, f"198.19.{k}.0/24", f"198.19.{k}.1") for k in range(4)]
    subnets.append(Subnet(5, "s4", "p", 1, "198.19.9.0/28", None, enable_dhcp=False))
    return networks, subnets


def _port(pid: int, rng: random.Random, subnets) -> Port:
    sub = rng.choice([s for s in subnets if s.id != 5])
    fixed = (FixedIp(sub.id, f"198.19.{sub.network_id - 1}.{10 + pid % 200}"),)
    if sub.network_id == 1 and rng.random() < 0.3:      # a second address, on the non-DHCP subnet
        fixed += (FixedIp(5, f"198.19.9.{2 + pid % 10}"),)
    node = rng.choice([None, *(n.name for n in NODES)])
    return Port(pid, f"p{pid}", "p", sub.network_id, f"02:00:00:00:{pid >> 8:02x}:{pid & 255:02X}", fixed, node)


def test_kept_servers_equal_fresh_ones_along_a_random_walk():
    rng = random.Random(7)
    networks, subnets = _world()
    ports = {pid: _port(pid, rng, subnets) for pid in range(1, 40)}
    kept, whole = DhcpServers(), Desired()
    # as the reconciler's hostlocal status asks: with the views of each pass (the servers' addresses
    # patched from those of the snapshot before)
    with_views, views, last = DhcpServers(), None, None
    next_id = 40
    for step in range(400):
        op = rng.random()
        touched = None
        if op < 0.25:
            ports[next_id] = _port(next_id, rng, subnets)
            touched, next_id = next_id, next_id + 1
        elif op < 0.45 and ports:
            touched = rng.choice(sorted(ports))
            del ports[touched]
        elif op < 0.65 and ports:
            touched = rng.choice(sorted(ports))
            ports[touched] = replace(ports[touched], node=rng.choice([None, *(n.name for n in NODES)]))
        elif op < 0.8 and ports:
            touched = rng.choice(sorted(ports))
            ports[touched] = _port(touched, rng, subnets)          # new network, addresses, MAC case
        elif op < 0.85:
            touched = rng.choice(sorted(ports))
            ports[touched] = replace(ports[touched])                # equal, but a new object
        elif op < 0.9:
            i = rng.randrange(4)
            subnets[i] = replace(subnets[i], enable_dhcp=not subnets[i].enable_dhcp)
        elif op < 0.95:
            i = rng.randrange(4)
            subnets[i] = replace(subnets[i], dns_nameservers=(f"198.18.1.{step % 250}",))
        else:
            i = rng.randrange(4)
            networks[i] = replace(networks[i], type="vlan" if networks[i].type == "vxlan" else "vxlan")
        snap = Snapshot(NODES, tuple(networks), tuple(subnets), tuple(ports[p] for p in sorted(ports)))
        before = {(n, s.network_id): s for n, servers in (kept._servers.items()) for s in servers.values()}
        got = kept(snap)
        assert got == dhcp_servers(snap), step
        assert whole(snap) == desired(snap), step
        previous, views = views, Views(before=views)
        views.follow(snap, last)
        if previous is not None:
            previous.settle()
        assert with_views(snap, views) == got, step
        last = snap
        if touched is not None and kept.rebuilt <= 2:
            # a port's change rebuilt at most its (node, network) before and after; every other
            # server is the very object of the call before
            same = sum(1 for n, servers in got.items() for s in servers if before.get((n, s.network_id)) is s)
            assert same >= len(before) - 2, step


def test_one_new_port_among_many_rebuilds_one_server():
    rng = random.Random(3)
    networks, subnets = _world()
    ports = [_port(pid, rng, subnets) for pid in range(1, 400)]
    kept = DhcpServers()
    first = kept(Snapshot(NODES, tuple(networks), tuple(subnets), tuple(ports)))
    new = replace(_port(400, rng, subnets), node="n1")
    got = kept(Snapshot(NODES, tuple(networks), tuple(subnets), (*ports, new)))
    assert kept.rebuilt == 1
    changed = [(n, s.network_id) for n, servers in got.items() for s in servers
               if not any(s is t for t in first.get(n, ()))]
    assert changed == [("n1", new.network_id)]
    assert any(h.hostname == "port-400" for s in got["n1"] if s.network_id == new.network_id for h in s.hosts)
