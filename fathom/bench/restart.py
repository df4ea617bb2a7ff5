"""`fathom bench restart`: how soon after a controller restart the ports made meanwhile turn active.

A lab under its own controller (TLS, as by default), built from fathom/bench/topologies/ovn-compare.yaml:
nodes c1, c2, gw and the fabric switch, seven bridges the controller programs, four VM ports. Each round:

1. port `w<round>` is created through the API for a VIF on c1 that is not plugged yet (`down`);
2. the controller is stopped and started again on the same ports and store (Lab.restart_controller);
   while it is down (`downtime` s: long enough for OVS's reconnection backoff to grow to whatever
   maximum the Controller rows allow) `w<round>`'s VIF is plugged, and so is the VIF of a port the
   API does not know yet, `j<round>` (as a Neutron journal replays a port created meanwhile);
3. from the moment the restarted controller answers its API (polled every 20 ms), `j<round>` is
   created at once, and both ports are waited for `active` (long-polls), while /v1/health is polled
   every 20 ms for the switches back and the lab's other ports for their statuses.

Figures per round, seconds from the API answering: every switch connected again, `w` active (plugged
while the controller was down), `j` active (created after); and how many samples of the other ports'
statuses were not `active` (the restart grace keeps the last controller's word while switches are
away: 0 means no status flapped).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from fathom.bench.report import dist, environment, machine_activity
from fathom.client import ApiError, Client
from fathom.lab.lab import Lab
from fathom.lab.ovs import process_running
from fathom.lab.sh import LabError, run
from fathom.lab.topology import load

TOPOLOGY = Path(__file__).parent / "topologies" / "ovn-compare.yaml"
NETWORK, NODE = "blue", "c1"
POLL_S = 0.02
ACTIVE_TIMEOUT_S = 30.0


class Bench:
    def __init__(self, lab_name: str = "brs", rounds: int = 5, downtime: float = 10.0, progress=lambda msg: None):
        self.lab, self.rounds, self.downtime, self.progress = Lab(lab_name), rounds, downtime, progress
        self.topo = load(TOPOLOGY)

    def _vif(self, name: str) -> None:
        """A VIF on NODE without a guest (both veth ends in the node), not plugged yet."""
        ns = self.lab.ns(NODE)
        run(["ip", "link", "add", name, "netns", ns, "type", "veth", "peer", "name", name + "g", "netns", ns])
        for dev in (name + "g", name):
            run(["ip", "link", "set", dev, "up"], ns=ns)

    def _port(self, api: Client, network_id: int, name: str, index: int) -> int:
        net = self.topo.network(NETWORK).cidr
        return api.post("/ports", json={
            "network_id": network_id, "name": name, "mac_address": self._mac(index),
            "fixed_ips": [{"ip_address": str(net.network_address + 512 + index)}], "node": NODE,
            "interface_name": name, "project_id": "bench"})["id"]

    def _mac(self, index: int) -> str:
        return f"02:0c:0a:00:{index >> 8 & 0xff:02x}:{index & 0xff:02x}"

    def one_round(self, r: int, network_id: int) -> dict:
        w, j = f"w{r}", f"j{r}"
        api = Client.for_lab(self.lab.state(), timeout=30)
        others = {p["id"] for p in api.list("/ports")}
        self._vif(w)
        self._vif(j)
        w_id = self._port(api, network_id, w, 2 * r)
        api.close()
        old_pid = self.lab.state()["controller"]["pid"]
        restart = threading.Thread(target=self.lab.restart_controller, kwargs={"downtime": self.downtime}, daemon=True)
        restart.start()
        while process_running(old_pid):   # a zombie is gone: its parent may reap it only later
            time.sleep(POLL_S)
        stopped = time.time()
        self.lab.plug_vm(NODE, w, self._mac(2 * r), NETWORK)
        self.lab.plug_vm(NODE, j, self._mac(2 * r + 1), NETWORK)
        url = self.lab.state()["controller"]["url"]
        while True:                       # the restarted controller's API, from its first answer
            try:
                probe = Client.for_lab(self.lab.state(), timeout=0.5)
                try:
                    probe.health()
                finally:
                    probe.close()
                break
            except (ApiError, OSError):
                if time.time() - stopped > self.downtime + 60:
                    raise LabError(f"the controller at {url} did not answer within {self.downtime + 60:.0f} s")
                time.sleep(POLL_S)
        t_api = time.time()
        api = Client.for_lab(self.lab.state(), timeout=30)
        j_id = self._port(api, network_id, j, 2 * r + 1)
        t_j_call = time.time()
        active: dict = {}

        def wait(key, port_id):
            """The port's first `active` within ACTIVE_TIMEOUT_S of the API's answer; an `error` on the
            way (its node's OVSDB connection coming back) is waited through."""
            waiter = Client.for_lab(self.lab.state(), timeout=ACTIVE_TIMEOUT_S + 10)
            try:
                while (left := t_api + ACTIVE_TIMEOUT_S - time.time()) > 0:
                    if waiter.wait_status("ports", port_id, "active", timeout=left)["status"] == "active":
                        active[key] = time.time()
                        return
                    time.sleep(POLL_S)
            except ApiError:
                pass
            finally:
                waiter.close()
        waiters = [threading.Thread(target=wait, args=a, daemon=True) for a in (("w", w_id), ("j", j_id))]
        for t in waiters:
            t.start()
        switches = len(self.lab.nodes()) * 2 + 1          # br-int and br-phy of each node, the fabric switch
        t_switches, samples, flapped = None, 0, []
        while any(t.is_alive() for t in waiters) or t_switches is None:
            if t_switches is None and len(api.health()["switches"]) >= switches:
                t_switches = time.time()
            for p in api.list("/ports"):
                if p["id"] in others:
                    samples += 1
                    if p["status"] != "active":
                        flapped.append((round(time.time() - t_api, 3), p["name"], p["status"], p["status_reason"]))
            if time.time() - t_api > ACTIVE_TIMEOUT_S + 5:
                break
            time.sleep(POLL_S)
        restart.join(30)
        api.close()

        def since(t):
            return None if t is None else round(t - t_api, 4)
        return {"round": r, "downtime_s": self.downtime, "t_stopped": stopped, "t_api": t_api,
                "switches_s": since(t_switches), "plugged_meanwhile_active_s": since(active.get("w")),
                "created_after_active_s": since(active.get("j")), "created_after_call_s": round(t_j_call - t_api, 4),
                "other_port_samples": samples, "other_ports_not_active": flapped}

    def run(self) -> dict:
        started = time.time()
        env = environment()
        env["machine_at_start"] = machine_activity((f"/{self.lab.name}/",))
        self.lab.down()
        self.progress(f"bringing up lab {self.lab.name}")
        try:
            self.lab.up(self.topo, str(TOPOLOGY))
            api = Client.for_lab(self.lab.state(), timeout=30)
            network_id = next(n["id"] for n in api.list("/networks") if n["name"] == NETWORK)
            api.close()
            rounds = []
            for r in range(self.rounds):
                self.progress(f"round {r + 1}/{self.rounds}: controller down {self.downtime:g} s")
                rounds.append(self.one_round(r, network_id))
            env["machine_at_end"] = machine_activity((f"/{self.lab.name}/",))
            summary = {key: dist([x[key] for x in rounds if x[key] is not None])
                       for key in ("switches_s", "plugged_meanwhile_active_s", "created_after_active_s")}
            summary["never_active"] = sum(x["plugged_meanwhile_active_s"] is None or x["created_after_active_s"] is None
                                          for x in rounds)
            summary["other_ports_not_active"] = sum(len(x["other_ports_not_active"]) for x in rounds)
            summary["other_port_samples"] = sum(x["other_port_samples"] for x in rounds)
            return {"benchmark": "restart", "environment": env, "elapsed_s": time.time() - started,
                    "parameters": {"rounds": self.rounds, "downtime_s": self.downtime, "topology": str(TOPOLOGY),
                                   "lab": self.lab.name},
                    "summary": summary, "rounds": rounds}
        finally:
            self.lab.down()


def markdown(doc: dict) -> str:
    env, s = doc["environment"], doc["summary"]

    def cell(d):
        return f"{d['p50']:.2f} | {d['max']:.2f}" if d.get("n") else "— | —"
    return "\n".join([
        f"Run of {env['date_utc']} ({doc['elapsed_s']:.0f} s), command `{doc.get('command', 'fathom bench restart')}`; "
        f"{env['cpus']} CPUs, kernel {env['kernel']}; load average at start {env['machine_at_start']['loadavg']}, "
        f"{env['machine_at_start']['foreign_ovs_vswitchd']} other labs' ovs-vswitchd running.", "",
        f"{doc['parameters']['rounds']} restarts, the controller down {doc['parameters']['downtime_s']:g} s each; "
        "seconds from the restarted controller answering its API:", "",
        "| | p50 | max |", "|---|---|---|",
        f"| every switch connected again | {cell(s['switches_s'])} |",
        f"| a port plugged while the controller was down: active | {cell(s['plugged_meanwhile_active_s'])} |",
        f"| a port created at once after it answered (its VIF plugged meanwhile): active | {cell(s['created_after_active_s'])} |",
        "", f"Never active: {s['never_active']}. The lab's other ports sampled during the waits: "
            f"{s['other_ports_not_active']} of {s['other_port_samples']} samples not active.", ""])
