"""The node agent does the host-local work, on real OVS in real namespaces, and the controller
never enters a host.

One lab (`ag1`): VM x1 on c1 in network blue, VM x2 on c2 in network red, a router between them in
`network-node` mode on gw. The controller process is watched with strace for the whole test: it
must make no setns, unshare or execve (it runs no command and enters no namespace; the agents do).

* The router is moved back to `distributed` and again to `network-node`: gw's agent builds the
  router namespace, the routed pings go through it (TTL 63, its qr counters move).
* A PPTMon attachment (source-sink, every packet) on the router's legs at gw (in: the blue leg's
  egress toward the namespace, out: the red leg's ingress from it) measures UDP from x1 to x2;
  the records arrive in the controller through the agent.
* Agent down (stopped, as `systemctl stop fathom-agent`): the router and the attachment turn
  `error` naming the agent, while a ping (every 50 ms) and UDP keep flowing through the namespace
  and the programs stay attached. Agent back, and then killed hard and restarted by its supervisor:
  both turn `active` again with nothing rebuilt (same namespace, same veths, same loader process)
  and the ping lost nothing.
* The controller restarted: the agents resync with it, nothing on the gateway is rebuilt, the ping
  through the namespace loses nothing.
"""
import re
import signal
import subprocess
import time

import pytest

from fathom.auth.client import lab_token
from fathom.client import Client
from fathom.host import exec as host_exec
from fathom.lab.ovs import wait_for

from .util import BackgroundPing, lab_api, running_lab, sh

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 3101, cidr: 198.19.81.0/24}
  - {name: red, type: vxlan, segmentation_id: 3102, cidr: 198.19.82.0/24}
routers:
  - {name: r, networks: [blue, red], mode: network-node}
nodes:
  - name: c1
    vms: [{name: x1, mac: "02:fb:00:00:81:0b", ip: 198.19.81.11/24, network: blue}]
  - name: c2
    vms: [{name: x2, mac: "02:fb:00:00:82:0c", ip: 198.19.82.12/24, network: red}]
  - name: gw
    role: gateway
underlay: {cidr: 198.18.0.0/24, mtu: 1600}
"""
X2 = "198.19.82.12"


@pytest.fixture(scope="module")
def lab():
    with running_lab("ag1", TOPOLOGY, standalone=False) as lab:
        yield lab


@pytest.fixture(scope="module")
def strace(lab, tmp_path_factory):
    """strace on the controller process (every thread, and any child it would start)."""
    out = tmp_path_factory.mktemp("strace") / "controller.strace"
    pid = lab.state()["controller"]["pid"]
    proc = subprocess.Popen(["strace", "-f", "-qq", "-p", str(pid), "-e", "trace=setns,unshare,execve,execveat",
                             "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    assert proc.poll() is None, proc.stderr.read()
    yield out
    proc.send_signal(signal.SIGINT)
    proc.wait(10)


def client(lab) -> Client:
    return Client(lab.state()["controller"]["url"], token=lab_token(lab.state()))


def router(lab) -> dict:
    return next(r for r in lab_api(lab).get("/routers").json() if r["name"] == "r")


def legs(lab) -> dict[str, int]:
    """network name -> the router interface's id (its legs are qr<id> / qrp<id>)."""
    c = lab_api(lab)
    nets = {n["id"]: n["name"] for n in c.get("/networks").json()}
    return {nets[i["network_id"]]: i["id"] for i in router(lab)["interfaces"]}


def router_ns(lab) -> str:
    return lab.ns(f"gw-r{router(lab)['id']}")


def identity(lab) -> dict:
    """What would change if the agent rebuilt the router: the namespace's inode, its links' ifindexes."""
    rns = router_ns(lab)
    inode = subprocess.run(["stat", "-c", "%i", f"/run/netns/{rns}"], capture_output=True, text=True,
                           check=True).stdout.strip()
    links = subprocess.run(["ip", "-n", rns, "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {"inode": inode, "links": sorted(re.findall(r"^(\d+): (qr\d+)@", links, re.M))}


def wait_status(lab, path: str, want: str, timeout: float, reason: str | None = None) -> dict:
    c = lab_api(lab)

    def check():
        obj = c.get(path).json()
        return obj if obj["status"] == want and (reason is None or reason in (obj["status_reason"] or "")) else None
    try:
        return wait_for(check, timeout, f"{path} {want}", interval=0.3)
    except Exception:
        raise AssertionError(f"{path}: {c.get(path).json()}") from None


def udp(lab, seconds: float) -> subprocess.Popen:
    """UDP from x1 to x2 through the router (x2 discards it)."""
    code = ("import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
            f"end=time.time()+{seconds}\n"
            f"while time.time()<end:\n s.sendto(b'x'*200,('{X2}',9)); time.sleep(0.01)\n")
    argv, env = lab.exec_args("x1", ["python3", "-c", code])
    return subprocess.Popen(argv, env=env)


def pptmon_filters(lab, leg: int) -> str:
    return sh(lab, "gw", "tc", "filter", "show", "dev", f"qrp{leg}", "egress").stdout


def test_network_node_router_is_built_by_the_agent(lab, strace):
    c = lab_api(lab)
    rid = router(lab)["id"]
    c.patch(f"/routers/{rid}", json={"mode": "distributed"}).raise_for_status()
    wait_status(lab, f"/routers/{rid}", "active", 20)
    wait_for(lambda: router_ns(lab) not in lab.namespaces(), 20, "the agent to remove the router namespace")
    c.patch(f"/routers/{rid}", json={"mode": "network-node"}).raise_for_status()
    wait_status(lab, f"/routers/{rid}", "active", 30)
    assert router_ns(lab) in lab.namespaces()
    before = sh(lab, "gw", "ip", "-s", "-j", "link", "show", f"qrp{legs(lab)['blue']}").stdout
    out = sh(lab, "x1", "ping", "-n", "-c", "3", "-i", "0.2", "-W", "1", X2, check=False).stdout
    assert " 0% packet loss" in out and "ttl=63" in out, out
    after = sh(lab, "gw", "ip", "-s", "-j", "link", "show", f"qrp{legs(lab)['blue']}").stdout
    assert before != after          # the echoes went through the gateway's namespace
    # an IPv4 router: nothing of IPv6 on its legs (no router solicitation, no multicast report)
    v6 = subprocess.run(host_exec.argv(["ip", "-6", "-o", "addr"], router_ns(lab)), capture_output=True,
                        text=True, check=True).stdout
    assert v6.strip() == "", v6
    agents = {a["node"]: a for a in c.get("/agents").json()}
    # both moves asked every node on the router's path to flush its (userspace) datapath; done
    for node in ("c1", "c2", "gw"):
        flushes = {k: v for k, v in agents[node]["objects"].items() if k.startswith("datapath_flush:")}
        assert [v["status"] for v in flushes.values()] == ["active"], (node, agents[node]["objects"])
    assert {n: a["state"] for n, a in agents.items()} == {"c1": "up", "c2": "up", "gw": "up"}
    assert agents["gw"]["facts"]["datapath_types"] and "netdev" in agents["gw"]["facts"]["datapath_types"]
    assert agents["gw"]["facts"]["ovs_kernel_module"] is False
    nodes = {n["name"]: n for n in c.get("/nodes").json()}
    assert nodes["gw"]["datapath_type"] is None    # no override: the agent's facts decide (netdev here)
    br_int = lab.ovs("gw").vsctl("get", "bridge", "br-int", "datapath_type")
    assert br_int == "netdev", br_int


def test_pptmon_attachment_and_failures_of_the_agent(lab, strace):
    c = lab_api(lab)
    rid = router(lab)["id"]
    leg = legs(lab)
    a = c.post("/pptmon/attachments", json={
        "name": "ag1-r", "node": "gw", "chain": "ag1r", "mode": "source-sink", "period_ns": 0,
        "in_interface": f"qrp{leg['blue']}", "in_direction": "egress",
        "out_interface": f"qrp{leg['red']}", "out_direction": "ingress"})
    assert a.status_code == 201, a.text
    aid = a.json()["id"]
    wait_status(lab, f"/pptmon/attachments/{aid}", "active", 30)
    assert "ppt_in" in pptmon_filters(lab, leg["blue"])
    udp(lab, 1.0).wait(10)
    wait_for(lambda: len(c.get("/pptmon/records", params={"chain": "ag1r"}).json()) >= 20, 30,
             "PPTMon records through the agent")
    rec = c.get("/pptmon/records", params={"chain": "ag1r", "limit": 1}).json()[0]
    assert rec["node"] == "gw" and rec["placement"] == "host" and rec["hops"][0]["vnf"] == 1

    # agent down: statuses say so, the data plane carries on
    built = identity(lab)
    loader = sh(lab, "gw", "pgrep", "-f", f"att{aid}").stdout.split()
    assert loader
    ping = BackgroundPing(lab, "x1", X2, 300, interval=0.05)
    lab.stop_agent("gw")
    sender = udp(lab, 60)
    wait_status(lab, f"/routers/{rid}", "error", 40, reason="agent on node gw not reporting")
    wait_status(lab, f"/pptmon/attachments/{aid}", "error", 10, reason="agent on node gw not reporting")
    assert "ppt_in" in pptmon_filters(lab, leg["blue"]) and identity(lab) == built
    n_before = len(c.get("/pptmon/records", params={"chain": "ag1r", "limit": 10000}).json())

    # back: nothing rebuilt; the records measured meanwhile are delivered
    lab.start_agent("gw")
    wait_status(lab, f"/routers/{rid}", "active", 30)
    wait_status(lab, f"/pptmon/attachments/{aid}", "active", 30)
    wait_for(lambda: len(c.get("/pptmon/records", params={"chain": "ag1r", "limit": 10000}).json()) > n_before,
             30, "the records measured while the agent was down")
    # killed hard: its supervisor restarts it (Restart=on-failure), still nothing rebuilt
    old = lab.agent_pid("gw")
    subprocess.run(["kill", "-9", str(old)], check=True)
    wait_for(lambda: (lab.agent_pid("gw") or old) != old, 30, "the supervisor to restart the agent")
    time.sleep(6)   # a report of the new agent
    wait_status(lab, f"/routers/{rid}", "active", 30)
    wait_status(lab, f"/pptmon/attachments/{aid}", "active", 30)
    sent, replies = ping.stop()
    received = len(replies)
    sender.kill()
    assert identity(lab) == built
    assert sh(lab, "gw", "pgrep", "-f", f"att{aid}").stdout.split() == loader
    assert sent > 200 and received >= sent - 1, (sent, received)   # the echo in flight at SIGINT

    # detached on delete
    assert c.delete(f"/pptmon/attachments/{aid}").status_code == 204
    wait_for(lambda: "ppt_in" not in pptmon_filters(lab, leg["blue"]), 30, "the programs detached")


def test_the_controller_never_entered_a_namespace(lab, strace):
    """Nothing above made the controller process run a command or enter a namespace."""
    time.sleep(0.5)
    calls = [line for line in strace.read_text().splitlines()
             if re.search(r"\b(setns|unshare|execve|execveat)\(", line)]
    assert calls == [], calls[:10]
    # and the strace was really watching (it is attached: a controller thread is its tracee)
    pid = lab.state()["controller"]["pid"]
    status = open(f"/proc/{pid}/status").read()
    assert re.search(r"TracerPid:\s+[1-9]", status), "strace is not attached to the controller"


def test_agents_resync_with_a_restarted_controller(lab):
    """The controller away for 3 s and back (same store): the agents reconnect and report, the
    router is `active` again, and the gateway's namespace was neither torn down nor rebuilt while
    traffic ran through it."""
    rid = router(lab)["id"]
    built = identity(lab)
    ping = BackgroundPing(lab, "x1", X2, 300, interval=0.05)
    time.sleep(1)
    lab.restart_controller(downtime=3)
    c = lab_api(lab)
    wait_for(lambda: {a["node"]: a["state"] for a in c.get("/agents").json()} ==
             {"c1": "up", "c2": "up", "gw": "up"}, 30, "the agents to report to the new controller")
    wait_status(lab, f"/routers/{rid}", "active", 30)
    time.sleep(1)
    sent, replies = ping.stop()
    received = len(replies)
    assert identity(lab) == built
    # ping counts the echo in flight when it is interrupted as sent and not received
    assert sent > 50 and received >= sent - 1, (sent, received)
