"""The reconciler's compile and DHCP servers over the API bench's creations, alone: one network of
PORTS ports on one node (their interfaces not plugged, as in `fathom bench scale --part api`), each
with an address and its project's default group, PER new ports a pass; each pass is
DesiredState.update (every app, views patched from the pass before) and the DHCP servers kept from
pass to pass (fathom.controller.hostlocal's Desired over the pass's views). Prints the thread's CPU
a pass in each quarter of the run and a creation over all. Args: PORTS PER [ROUNDS]. Run with
PYTHONPATH=<tree> from outside the repository (python adds the working directory to its path)."""
import json, sys, time

from fathom.controller.desired import DesiredState
from fathom.model import FixedIp, Network, Node, Port, SecurityGroup, SecurityGroupRule, Snapshot, Subnet
from fathom.model.hostlocal_desired import Desired

PORTS, PER = int(sys.argv[1]), int(sys.argv[2])
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 1


def run() -> list[float]:
    node = Node(1, "n1", "compute", "10.99.0.1", "198.18.0.1", "complete", ofports={"vxlan0": 1})
    base = dict(nodes=(node,), networks=(Network(1, "net", "p", "vxlan", 101),),
                subnets=(Subnet(1, "s", "p", 1, "10.100.0.0/16", "10.100.0.1"),),
                security_groups=(SecurityGroup(1, "default", "p"),),
                security_group_rules=(SecurityGroupRule(1, 1, "egress", "IPv4"),
                                      SecurityGroupRule(2, 1, "ingress", "IPv4", remote_group_id=1)))
    state, dhcp, ports, times = DesiredState(), Desired(), [], []
    state.update(Snapshot(**base), full=True)
    for start in range(1, PORTS + 1, PER):
        for pid in range(start, min(start + PER, PORTS + 1)):
            ports.append(Port(pid, f"p{pid}", "p", 1, f"02:fd:00:00:{pid >> 8:02x}:{pid & 255:02x}",
                              (FixedIp(1, f"10.100.{(pid + 1) >> 8}.{(pid + 1) & 255}"),), "n1", f"if{pid}",
                              True, (1,)))
        snap = Snapshot(**base, ports=tuple(ports))
        t = time.thread_time()
        state.update(snap, full=False)
        dhcp(snap, (), state.views)
        times.append(time.thread_time() - t)
    return times


quarters, total = [[] for _ in range(4)], []
for _ in range(ROUNDS):
    times = run()
    total.append(1000 * sum(times) / PORTS)
    q = len(times) // 4
    for i in range(4):
        quarters[i].append(1000 * sum(times[i * q:(i + 1) * q]) / q)
print(json.dumps({"ports": PORTS, "per_pass": PER, "rounds": ROUNDS,
                  "ms_a_pass_by_quarter": [round(min(x), 3) for x in quarters],
                  "ms_a_creation": round(min(total), 4)}))
