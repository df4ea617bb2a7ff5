"""`fathom trace --actual` on the default lab under the controller: each node's agent traces its
br-int with ofproto/trace. With the switches holding their desired flows the actual walk is the
desired one, hop for hop, and ping agrees; with a flow deleted from compute2's br-int behind the
controller's back, the actual verdict is a drop at that flow's stage and the trace names the
difference from the desired state."""
import pytest

from .util import await_status, lab_api, ping, running_lab, sh


@pytest.fixture(scope="module")
def lab():
    with running_lab("qd1", standalone=False) as lab:
        yield lab


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
