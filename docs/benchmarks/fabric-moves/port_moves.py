"""A port moves from compute2 to compute3 while vm1 (same subnet) and grn1 (routed) ping it
every 20 ms. When do echoes come back after the move, against the port's `active`?

    PYTHONPATH=. .venv/bin/python docs/benchmarks/fabric-moves/port_moves.py mgr 4 | tail -1 > docs/benchmarks/fabric-moves/port-moves.json
"""
import json
import subprocess
import sys
import time

from tests.lab.util import BackgroundPing, await_status, lab_api, running_lab, vm_namespace

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 1001, cidr: 198.19.1.0/24, project: alpha}
  - {name: green, type: vxlan, segmentation_id: 1003, cidr: 198.19.2.0/24, project: alpha}
routers:
  - {name: r1, networks: [blue, green]}
nodes:
  - name: compute1
    vms:
      - {name: vm1, mac: "02:fa:00:00:01:01", ip: 198.19.1.11/24, network: blue}
      - {name: grn1, mac: "02:fa:00:00:03:01", ip: 198.19.2.21/24, network: green}
  - name: compute2
    vms:
      - {name: vm3, mac: "02:fa:00:00:01:03", ip: 198.19.1.13/24, network: blue}
  - name: compute3
    vms:
      - {name: vm5, mac: "02:fa:00:00:01:05", ip: 198.19.1.15/24, network: blue}
"""
PREFIX = sys.argv[1] if len(sys.argv) > 1 else "mgr"
MOVES = int(sys.argv[2]) if len(sys.argv) > 2 else 4
MAC, IP = "02:fa:00:00:01:03", "198.19.1.13"


out = []
with running_lab(PREFIX, TOPOLOGY, standalone=False) as lab:
    c = lab_api(lab)
    port = next(p for p in c.get("/ports").json() if p["name"] == "vm3")
    where = {"compute2": port["interface_name"]}
    made = []
    try:
        for i in range(MOVES):
            src_node = "compute2" if i % 2 == 0 else "compute3"
            dst_node = "compute3" if i % 2 == 0 else "compute2"
            new_if = f"mv{i}"
            vm_namespace(lab, new_if, dst_node, MAC, IP, gateway="198.19.1.1")
            made.append(new_if)
            pings = [BackgroundPing(lab, "vm1", IP, 12), BackgroundPing(lab, "grn1", IP, 12)]
            time.sleep(3)
            t_move = time.time()
            lab.ovs(src_node).vsctl("del-port", "br-int", where[src_node])
            c.patch(f"/ports/{port['id']}", json={"node": dst_node, "interface_name": new_if}).raise_for_status()
            lab.ovs(dst_node).vsctl("add-port", "br-int", new_if)
            await_status(c, f"/ports/{port['id']}", timeout=20)
            t_active = time.time()
            where[dst_node] = new_if
            row = {"move": i, "to": dst_node, "active_after_s": round(t_active - t_move, 3)}
            for name, p in zip(("same-subnet", "routed"), pings):
                sent, received, times = p.result(60)
                after = [t for t in times if t > t_move]
                row[name] = {"sent": sent, "received": received,
                             "first_reply_after_move_s": round(after[0] - t_move, 3) if after else None,
                             "first_reply_after_active_s": round(after[0] - t_active, 3) if after else None,
                             "replies_after_active": sum(1 for t in times if t > t_active)}
            # remove the old VM namespace (its IP must not answer)
            old_ns = lab.ns([m for m in made if m != new_if][-1]) if len(made) > 1 else lab.ns("vm3")
            subprocess.run(["ip", "netns", "del", old_ns], capture_output=True)
            print(json.dumps(row), flush=True)
            out.append(row)
    finally:
        for m in made:
            subprocess.run(["ip", "netns", "del", lab.ns(m)], capture_output=True)
print(json.dumps(out))
