import sys, time
from dataclasses import replace
from fathom.model import FixedIp, Network, Node, Port, Snapshot, Subnet
from fathom.model.hostlocal_desired import Desired
node = Node(1, "n1", "compute", "10.99.0.1", "198.18.0.1", "complete", ofports={"vxlan0": 1})
base = dict(nodes=(node,), networks=(Network(1, "net", "p", "vxlan", 101),), subnets=(Subnet(1, "s", "p", 1, "10.100.0.0/16", "10.100.0.1"),))
d = Desired(); ports = []; t = 0
for start in range(1, 2001, 20):
    for pid in range(start, start + 20):
        ports.append(Port(pid, f"p{pid}", "p", 1, f"02:fd:00:00:{pid >> 8:02x}:{pid & 255:02x}", (FixedIp(1, f"10.100.{(pid + 1) >> 8}.{(pid + 1) & 255}"),), "n1", f"if{pid}", True, (1,)))
    snap = Snapshot(**base, ports=tuple(replace(p) for p in ports))   # every Port a new object: a whole read
    t0 = time.thread_time(); d(snap); t += time.thread_time() - t0
print("ms a creation", 1000 * t / 2000)
