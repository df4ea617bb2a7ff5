"""The event-driven, incremental controller on real OVS: a port is `down` until its VIF is plugged
(the node's OVSDB says so, no periodic pass needed), `active` once the switches hold its flows —
and then it answers pings; plugging compiles only what the port touches; a flow deleted behind the
controller's back is found by the periodic check and put back. In the same lab, `fathom trace
--actual` (each node's agent traces its br-int with ofproto/trace): with the switches holding their
desired flows the actual walk is the desired one, hop for hop, and ping agrees; with a flow deleted
from compute2's br-int behind the controller's back, the actual verdict is a drop at that flow's
stage and the trace names the difference from the desired state."""
import re
import time

import pytest

from fathom.client import Client
from fathom.lab.ovs import wait_for

from .util import await_status, controller_log, lab_api, ping, running_lab, sh, unplugged_vm

VM_IP, VM_MAC = "198.19.1.50", "02:fa:00:00:01:50"


@pytest.fixture(scope="module")
def lab():
    with running_lab("ic1", standalone=False) as lab:
        yield lab


def client(lab) -> Client:
    return Client.for_lab(lab.state())


def health(lab) -> dict:
    with lab_api(lab) as api:
        return api.get("/health").json()


def test_a_port_is_down_until_its_vif_is_plugged_and_plugging_is_incremental(lab):
    api = client(lab)
    net = api.find("networks", "blue")
    unplugged_vm(lab, "icx", "compute1", VM_MAC, VM_IP)
    port = api.post("/ports", json={"network_id": net["id"], "name": "icx", "node": "compute1",
                                    "interface_name": "icx", "mac_address": VM_MAC,
                                    "fixed_ips": [{"ip_address": VM_IP}]})
    got = api.wait_status("ports", port["id"], "down", timeout=10)
    assert got["status"] == "down" and got["status_reason"] == "interface 'icx' is not plugged on node compute1"
    before = health(lab)["recomputes"]
    decisions = health(lab)["port_status_decisions"]

    lab.ovs("compute1").vsctl("add-port", "br-int", "icx", "--", "set", "interface", "icx",
                              "external_ids:iface-id=icx")
    got = api.wait_status("ports", port["id"], "active", timeout=10)
    assert got["status"] == "active", got
    assert ping(lab, "icx", "198.19.1.13").returncode == 0            # vm3, on compute2
    # the plug was compiled incrementally: no new whole recompile of the tenant app
    after = health(lab)["recomputes"]
    assert {k: v for k, v in after.items() if k.startswith("tenant:")} == \
        {k: v for k, v in before.items() if k.startswith("tenant:")}
    # and its statuses decided for the ports it reached, not every port again
    now = health(lab)["port_status_decisions"]
    assert now["changed"] > decisions["changed"], (decisions, now)

    lab.ovs("compute1").vsctl("del-port", "br-int", "icx")
    got = api.wait_status("ports", port["id"], "down", timeout=10)
    assert got["status"] == "down"
    assert health(lab)["incremental_mismatches"] == 0


def test_a_flow_deleted_behind_our_back_is_put_back_by_the_check(lab):
    flows = lab.run("compute2", "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", "br-int", "table=0", check=True).stdout
    victim = next(line for line in flows.splitlines() if "in_port=" in line and "cookie=0x205" in line)
    in_port = re.search(r"in_port=(\d+)", victim).group(1)
    drift = health(lab)["drift"].get("openflow", 0)
    lab.run("compute2", "ovs-ofctl", "-O", "OpenFlow14", "del-flows", "--strict", "br-int",
            f"table=0,priority=100,in_port={in_port}", check=True)

    def restored() -> bool:
        out = lab.run("compute2", "ovs-ofctl", "-O", "OpenFlow14", "dump-flows", "br-int",
                      f"table=0,in_port={in_port}", check=True).stdout
        return f"in_port={in_port}" in out
    t0 = time.monotonic()
    wait_for(restored, 30, "the deleted flow back")       # the lab checks every 10 s
    assert time.monotonic() - t0 < 30
    assert health(lab)["drift"].get("openflow", 0) >= drift + 1, controller_log(lab)


def _trace(c, ports, **extra) -> dict:
    r = c.post("/traces", json={"port_id": ports["vm1"], "to_port_id": ports["vm3"], "actual": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_actual_equals_desired_then_a_deleted_flow_drops(lab):
    c = lab_api(lab)
    ports = {p["name"]: p["id"] for p in c.get("/ports").json()}
    await_status(c, f"/ports/{ports['vm3']}", timeout=60)
    t = _trace(c, ports)
    assert [(h["switch"], h["tables"]) for h in t["hops"]] == [("br-int compute1", "actual"),
                                                               ("br-int compute2", "actual")], t["hops"]
    assert all("differs" not in h for h in t["hops"]), t["hops"]
    assert t["verdict"]["result"] == "delivered" and t["verdict"]["port"] == "vm3", t["verdict"]
    assert t["verdict"] == t["desired"]["verdict"] and "difference" not in t
    stages = [s["stage"] for s in t["hops"][1]["steps"]]
    assert stages[0] == "classify" and stages[-1] == "output" and "ingress-acl" in stages, stages
    assert ping(lab, "vm1", "198.19.1.13").returncode == 0

    # the flow compute2's output stage delivers to vm3 with, deleted behind the controller's back
    # (its next check puts it back within seconds: deleted again if the trace came after that)
    out = t["hops"][1]["steps"][-1]
    assert out["owner"]["kind"] == "port" and out["owner"]["name"] == "vm3", out
    for _ in range(3):
        sh(lab, "compute2", "ovs-ofctl", "-O", "OpenFlow14", "del-flows", "br-int",
           f"table={out['table']},{out['match']}")
        dropped = _trace(c, ports)
        if dropped["verdict"]["result"] != "delivered":
            break
    assert dropped["verdict"]["result"] == "dropped", dropped["verdict"]
    assert dropped["desired"]["verdict"]["result"] == "delivered"
    diff = dropped["difference"]
    assert (diff["desired"], diff["actual"], diff["switch"], diff["stage"]) == \
        ("delivered", "dropped", "br-int compute2", "output"), diff
    assert "desired priority 100 (port vm3)" in diff["reason"] and "table-miss" in diff["reason"], diff
    leaf = next(lf for lf in dropped["leaves"] if lf["result"] == "dropped")
    assert leaf["hop"] == 1 and "at output" in leaf["detail"], dropped["leaves"]
