"""`fathom bench ha`: controller replicas failing while the cloud works.

A lab under a cluster of controller replicas (`fathom controller --cluster`) on a PostgreSQL server
the bench starts (durable: PostgreSQL's defaults, data on disk), built from TOPOLOGY: three compute
nodes and the lab's fabric switch, a router between two networks. Throughout, VMs ping every 20 ms
across nodes (on one network) and across the router, and `writers` API writers create and delete
ports (each write over every replica's endpoint, its own request id kept across its retries).

Events, `repeat` times each, one after the other:

- `kill`: SIGKILL of the replica that masters a node's br-int;
- `pause`: SIGSTOP of that replica for `pause` seconds, then SIGCONT;
- `rolling`: every replica stopped (SIGTERM) and started again, one after the other;
- `postgres`: PostgreSQL stopped for `pg_down` seconds, then started again.

Each event's timeline, in seconds from the event: `lease` (another live replica holds the node's
br-int lease, polled in GET /v1/cluster every 50 ms), `applied` (a port created on that node right
after the event, its VIF already plugged, has flows for its MAC in the node's br-int, read with
ovs-ofctl: the switch's master applied them; a port's `active` may be decided by a replica that is
not the master). Echoes lost and the writers' answers are counted over the whole run (a 503 or an
unreachable replica is retried on the next; any other 5xx counts as a failure).
A paused replica, once woken: the switches' answers that it is no longer master (role status,
IS_SLAVE, stale role requests: `fathom_openflow_not_master_total` on its /metrics) and whether the
node's br-int holds what its new master wants (`in_sync`: no flow written by the woken one).
At the end every write acknowledged with 2xx is checked against the store (a created port exists
unless its deletion was acknowledged; a deleted one is gone).

Targets: no echo lost, no acknowledged write missing, no 5xx but 503; kill -> applied p50 <= 1.5 s,
p99 <= 3 s (with the lease timing reported); a woken replica applies nothing (in sync).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fathom.bench.report import dist, environment, machine_activity
from fathom.client import REQUEST_ID, Client
from fathom.host import exec as host_exec
from fathom.lab import sh

TOPOLOGY = Path(__file__).parent / "topologies" / "ha.yaml"
# the probes' addresses in blue: .100 to .189; the writers' (64 at most) .191 to .254
PROBE_ADDRESSES = 90
EVENTS = ("kill", "pause", "rolling", "postgres")
TARGET_P50_S, TARGET_P99_S = 1.5, 3.0
POLL_S = 0.05
SETTLE_TIMEOUT_S = 60.0
# seconds after the probes' VIFs are plugged before the pings may start: ovs-vswitchd takes the
# host's link changes (one or more a VIF) from netlink after they were made, each a rebuild of its
# tunnel routes and endpoints in which a tunnel packet can be lost (Probe)
STOCK_SETTLE_S = 2.0


# ---------------------------------------------------------------------------------------------- the data plane

class Pinger:
    """`ping -i 0.02` from a VM; `stop()` -> (sent, sequence numbers never answered). Its output goes
    to a file: a pipe read only at the end would fill (64 KiB, ~1000 answers) and stop ping."""

    def __init__(self, lab, vm: str, ip: str):
        self.name = f"{vm}->{ip}"
        self.out = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(host_exec.argv(["ping", "-i", "0.02", "-W", "1", ip], lab.ns(vm)),
                                     stdout=self.out, stderr=subprocess.STDOUT, text=True)

    def stop(self) -> tuple[int, list[int]]:
        """Sent and lost echoes (the last one aside: it may still have been on its way)."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=10)
        self.out.seek(0)
        out = self.out.read()
        self.out.close()
        sent = int(re.search(r"(\d+) packets transmitted", out).group(1))
        answered = {int(s) for s in re.findall(r"icmp_seq=(\d+) ttl=", out)}
        return sent, [s for s in range(1, sent) if s not in answered]


# ---------------------------------------------------------------------------------------------- the cluster

class Cluster:
    """The lab's replicas as the bench sees them (their entries in the lab's state, kept current)."""

    def __init__(self, lab, token: str):
        self.lab, self.token = lab, token
        self.replicas = list(lab.state()["controller"]["replicas"])
        self.api = Client([r["url"] for r in self.replicas], token=token, timeout=10)

    def one(self, url: str) -> Client:
        return Client(url, token=self.token, timeout=5)

    def status(self) -> dict:
        return self.api.get("/cluster")

    def holders(self) -> dict[str, str | None]:
        """switch -> the API address of its lease's live holder (None: no master)."""
        cluster = self.status()
        address = {r["id"]: r["address"] for r in cluster["replicas"] if r["live"]}
        return {x["switch"]: address.get(x["holder"]) for x in cluster["leases"]}

    def master_of(self, switch: str) -> str:
        """The API address of `switch`'s live master, once it has one (a lease moving toward a
        replica that just joined has none for a moment)."""
        return wait(lambda: self.holders()[switch], SETTLE_TIMEOUT_S, f"a live master of switch {switch}")

    def settled(self) -> bool:
        """Every replica live and every switch mastered."""
        cluster = self.status()
        return (sum(r["live"] for r in cluster["replicas"]) == len(self.replicas)
                and all(x["holder"] for x in cluster["leases"]))

    def wait_settled(self, timeout: float = SETTLE_TIMEOUT_S) -> None:
        wait(self.settled, timeout, "every replica live and every switch mastered")

    def ask_first(self, url: str) -> None:
        """The API client asks `url` first (one other than a replica the event is about to stop: the
        timeline is the cluster's take-over, not a client's wait for a silent endpoint)."""
        self.api.current = self.api.endpoints.index(url)

    def other_than(self, url: str) -> str:
        return next(r["url"] for r in self.replicas if r["url"] != url)

    def index(self, url: str) -> int:
        return next(i for i, r in enumerate(self.replicas) if r["url"] == url)

    def restart(self, index: int) -> None:
        """Replica `index` stopped (if it runs) and started again where it ran."""
        self.replicas[index] = self.lab.restart_replica(index)

    def not_master(self, url: str) -> dict[str, float]:
        """A replica's count of the switches' "not master" answers, by kind (its /metrics)."""
        client = self.one(url)
        try:
            text = client.http.get("/metrics").text
        finally:
            client.close()
        return {m[1]: float(m[2]) for m in re.finditer(r'^fathom_openflow_not_master_total\{answer="(\w+)"\} (\S+)$',
                                                       text, re.M)}

    def close(self) -> None:
        self.api.close()


def wait(predicate, timeout: float, what: str, poll: float = POLL_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = predicate()
        except Exception:  # noqa: BLE001 - a replica down or a store away meanwhile: ask again
            got = None
        if got:
            return got
        time.sleep(poll)
    raise TimeoutError(f"waited {timeout:.0f} s for {what}")


# ---------------------------------------------------------------------------------------------- the writers

@dataclass
class Writes:
    """What the writers did: acknowledged creates (port id -> name) and deletes, answers by status."""
    created: dict[int, str] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)
    answers: dict[str, int] = field(default_factory=dict)     # "201", "503", "unreachable", ...
    retried_ok: int = 0        # writes that succeeded after a failed try
    given_up: int = 0          # writes that never succeeded within RETRY_FOR_S
    unfound: list[str] = field(default_factory=list)   # creations said committed whose port no list shows
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str) -> None:
        with self.lock:
            self.answers[what] = self.answers.get(what, 0) + 1

    def five_hundreds(self) -> dict[str, int]:
        return {k: n for k, n in self.answers.items() if k.startswith("5")}


# what a 409 to a retried write says when the write committed but its answer was lost
HEADER_COMMITTED = "was committed but its response was not recorded"


def committed(r: httpx.Response) -> bool:
    """A retried write's answer that it committed, though its first answer was lost (the replica
    that ran it stopped before recording it): as good as the answer for the writer."""
    return r.status_code == 409 and HEADER_COMMITTED in r.text


class Writers:
    """`n` threads creating and deleting ports in `network_id` (no node: the store's path) until stopped.
    Every write goes to one replica, then on failure to the next with the same request id, until
    answered (RETRY_FOR_S at most)."""
    RETRY_FOR_S = 60.0

    def __init__(self, urls: list[str], token: str, network_id: int, n: int, first_ip: str):
        self.urls, self.network_id, self.n = urls, network_id, n
        self.prefix = f"hw{uuid.uuid4().hex[:6]}-"
        base = [int(x) for x in first_ip.split(".")]
        self.ips = [".".join(map(str, base[:3] + [base[3] + i])) for i in range(n)]
        self.http = [httpx.Client(base_url=u + "/v1", headers={"Authorization": f"Bearer {token}"}, timeout=10)
                     for u in urls]
        self.writes = Writes()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def start(self) -> "Writers":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> Writes:
        self._stop.set()
        for t in self._threads:
            t.join(self.RETRY_FOR_S + 15)
        return self.writes

    def _write(self, i: int, method: str, path: str, body: dict | None = None) -> httpx.Response | None:
        key, tried, failed = uuid.uuid4().hex, 0, False
        deadline = time.monotonic() + self.RETRY_FOR_S
        while time.monotonic() < deadline:
            http = self.http[(i + tried) % len(self.http)]
            tried += 1
            try:
                r = http.request(method, path, json=body, headers={REQUEST_ID: key})
            except httpx.HTTPError:
                self.writes.count("unreachable")
                failed = True
                time.sleep(0.1)
                continue
            self.writes.count(str(r.status_code))
            if committed(r):
                return r     # it committed; its answer was lost with the replica that ran it
            if r.status_code >= 500 or r.status_code == 409:
                failed = True
                time.sleep(0.1)
                continue
            if failed:
                with self.writes.lock:
                    self.writes.retried_ok += 1
            return r
        with self.writes.lock:
            self.writes.given_up += 1
        return None

    def _find(self, i: int, name: str) -> int | None:
        """The id of the port named `name`, asked of each replica in turn until one answers."""
        deadline, tried = time.monotonic() + self.RETRY_FOR_S, 0
        while time.monotonic() < deadline:
            http = self.http[(i + tried) % len(self.http)]
            tried += 1
            try:
                r = http.get("/ports", params={"name": name})
            except httpx.HTTPError:
                r = None
            if r is not None and r.status_code == 200:
                return r.json()[0]["id"] if r.json() else None
            time.sleep(0.1)
        return None

    def _run(self, i: int) -> None:
        k = 0
        while not self._stop.is_set():
            k += 1
            name = f"{self.prefix}{i}-{k}"
            r = self._write(i, "POST", "/ports", {"network_id": self.network_id, "name": name,
                                                  "fixed_ips": [{"ip_address": self.ips[i]}]})
            if r is None or (r.status_code != 201 and not committed(r)):
                continue
            # a creation that committed unanswered (409) is found by its name
            port = r.json()["id"] if r.status_code == 201 else self._find(i, name)
            with self.writes.lock:
                if port is None:
                    self.writes.unfound.append(name)
                    continue
                self.writes.created[port] = name
            r = self._write(i, "DELETE", f"/ports/{port}")
            # a deletion that committed unanswered (409) is done too
            if r is not None and (r.status_code in (204, 404) or committed(r)):
                with self.writes.lock:
                    self.writes.deleted.add(port)

    def missing(self, api: Client) -> list[str]:
        """Acknowledged writes the store does not show: a created port gone without an acknowledged
        delete, a deleted port still there."""
        present = {p["id"] for p in api.list("/ports") if p["name"].startswith(self.prefix)}
        w = self.writes
        return ([f"created {w.created[p]} (id {p}) missing" for p in w.created if p not in w.deleted and p not in present]
                + [f"deleted {w.created[p]} (id {p}) still there" for p in w.deleted if p in present]
                + [f"created {name} (committed, unanswered) not found" for name in w.unfound])

    def close(self) -> None:
        for h in self.http:
            h.close()


# ---------------------------------------------------------------------------------------------- a port's flows

class Probe:
    """Ports made on `node` for VIFs plugged beforehand (veth pairs inside the node): a port created
    after an event turns `active` once the node's br-int master applied its flows.

    The VIFs are plugged before the pings start (`stock`) and unplugged after they stop (`unplug`):
    on OVS's userspace datapath every host link change (a veth made, deleted, or its flags changed
    by add-port) makes ovs-vswitchd re-read the host's routes, and packets its revalidator meets in
    that gap can be dropped for a few ms whatever the controllers do (docs/deploy.md). The events
    then change only what the controllers do."""

    def __init__(self, lab, api: Client, network: str, network_id: int, node: str, first_ip: str):
        self.lab, self.api, self.network, self.network_id, self.node = lab, api, network, network_id, node
        self.base = [int(x) for x in first_ip.split(".")]
        self.made = 0
        self.stocked: list[tuple[str, str, str]] = []
        self.used: list[tuple[str, str, str]] = []

    def stock(self, n: int) -> None:
        """Plug `n` VIFs now, for the next `n` calls of `plug`; returns once ovs-vswitchd has had
        STOCK_SETTLE_S to take the link changes."""
        self.stocked += [self._new() for _ in range(n)]
        time.sleep(STOCK_SETTLE_S)

    def plug(self) -> tuple[str, str, str]:
        """A VIF on the node, stocked or new (not a port yet): (name, mac, ip)."""
        vif = self.stocked.pop(0) if self.stocked else self._new()
        self.used.append(vif)
        return vif

    def unplug(self) -> None:
        """Every VIF this probe plugged off the node (their ports removed before)."""
        for name, _, _ in self.used + self.stocked:
            self.lab.ovs(self.node).vsctl("--if-exists", "del-port", "br-int", name)
            sh.run(["ip", "link", "del", name], ns=self.lab.ns(self.node), check=False)
        self.used, self.stocked = [], []

    def _new(self) -> tuple[str, str, str]:
        self.made += 1
        n = self.made
        name, mac = f"hp{n}", f"02:fa:0e:00:{n >> 8 & 0xff:02x}:{n & 0xff:02x}"
        # PROBE_ADDRESSES in turn: a probe's port is deleted after its event, so its address is free
        # again by the time it comes round
        ip = ".".join(map(str, self.base[:3] + [self.base[3] + (n - 1) % PROBE_ADDRESSES]))
        ns = self.lab.ns(self.node)
        sh.run(["ip", "link", "add", name, "netns", ns, "type", "veth", "peer", "name", name + "g", "netns", ns])
        for dev in (name + "g", name):
            sh.run(["ip", "link", "set", dev, "up"], ns=ns)
        self.lab.plug_vm(self.node, name, mac, self.network)
        return name, mac, ip

    def create(self, vif: tuple[str, str, str]) -> int:
        name, mac, ip = vif
        return self.api.post("/ports", json={"network_id": self.network_id, "name": name, "mac_address": mac,
                                             "fixed_ips": [{"ip_address": ip}], "node": self.node,
                                             "interface_name": name})["id"]

    def applied(self, vif: tuple[str, str, str], timeout: float = 30.0) -> bool:
        """Whether the node's br-int holds flows for the VIF's MAC within `timeout` s (read from the
        switch: a port's `active` may be decided by a replica that is not the switch's master)."""
        try:
            return wait(lambda: vif[1] in self.lab.ovs(self.node).ofctl("dump-flows", "--no-stats", "br-int"),
                        timeout, f"flows for {vif[1]} on {self.node}'s br-int")
        except TimeoutError:
            return False

    def active(self, port: int, timeout: float = 30.0) -> bool:
        return self.api.wait_status("ports", port, "active", timeout=timeout)["status"] == "active"

    def remove(self, port: int, vif: tuple[str, str, str]) -> None:
        """The VIF's port deleted through the API; the VIF stays plugged until `unplug`."""
        self.api.delete(f"/ports/{port}")


# ---------------------------------------------------------------------------------------------- events

def _after_event(cluster: Cluster, probe: Probe, switch: str, t0: float, old: str | None, vif) -> dict:
    """The event's timeline from `t0` (monotonic): the lease moved off `old`, and the flows of a port
    made right after the event on the switch."""
    out: dict = {}
    port = probe.create(vif)
    done = threading.Event()

    def lease():
        try:
            wait(lambda: (h := cluster.holders().get(switch)) and h != old, SETTLE_TIMEOUT_S, "the lease to move")
            out["lease_s"] = time.monotonic() - t0
        except TimeoutError:
            out["lease_s"] = None
        done.set()
    threading.Thread(target=lease, daemon=True).start()
    out["applied_s"] = time.monotonic() - t0 if probe.applied(vif) else None
    done.wait(SETTLE_TIMEOUT_S + 5)
    out["port"] = port
    return out


def kill_master(cluster: Cluster, probe: Probe, switch: str, start_again: bool = True) -> dict:
    """SIGKILL the master of `switch`; its timeline; then (`start_again`) the replica started again,
    and settled."""
    victim = cluster.master_of(switch)
    index = cluster.index(victim)
    vif = probe.plug()
    cluster.ask_first(cluster.other_than(victim))
    t0 = time.monotonic()
    os.kill(cluster.replicas[index]["pid"], signal.SIGKILL)
    out = {"event": "kill", "replica": index, **_after_event(cluster, probe, switch, t0, victim, vif)}
    probe.remove(out.pop("port"), vif)
    if start_again:
        cluster.restart(index)
        cluster.wait_settled()
    return out


def pause_master(cluster: Cluster, probe: Probe, node: str, switch: str, seconds: float) -> dict:
    """SIGSTOP the master of `switch` for `seconds`, SIGCONT; its timeline, then what the woken one
    heard from the switches and whether the node's br-int holds what its new master wants."""
    victim = cluster.master_of(switch)
    index = cluster.index(victim)
    pid = cluster.replicas[index]["pid"]
    before = cluster.not_master(victim)
    vif = probe.plug()
    cluster.ask_first(cluster.other_than(victim))
    t0 = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        out = {"event": "pause", "replica": index, "paused_s": seconds,
               **_after_event(cluster, probe, switch, t0, victim, vif)}
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
    finally:
        os.kill(pid, signal.SIGCONT)
    woke = time.monotonic()
    out["paused_s"] = round(woke - t0, 3)     # longer than asked when the take-over took longer
    cluster.wait_settled()
    time.sleep(1.0)      # the woken replica's threads have run: whatever it was about to write, it tried
    after = cluster.not_master(victim)
    out["not_master_answers"] = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(after) | set(before))}
    # the woken replica's return can move leases once more: ask the switch's master of that moment
    master = wait(lambda: cluster.holders().get(switch), SETTLE_TIMEOUT_S, f"a master of {switch}")
    api = cluster.one(master)
    try:
        out["in_sync"] = wait(lambda: api.get(f"/nodes/{node}/flows")["in_sync"], 10, "the br-int in sync")
    except TimeoutError:
        out["in_sync"] = False
    finally:
        api.close()
    out["settled_after_wake_s"] = round(time.monotonic() - woke, 3)
    probe.remove(out.pop("port"), vif)
    return out


def rolling_restart(cluster: Cluster, probe: Probe) -> dict:
    """Every replica stopped and started again in turn, each once the cluster settled; a port
    created when the first stops must get its flows on the switch meanwhile. Per replica: seconds
    from its SIGTERM to the cluster settled again (`restart_s`), of which to its API answering
    again (`answers_s`)."""
    vif = probe.plug()
    t0 = time.monotonic()
    steps, answers = [], []
    result: dict = {}

    def port():
        p = probe.create(vif)
        result["applied_s"] = time.monotonic() - t0 if probe.applied(vif, SETTLE_TIMEOUT_S) else None
        result["port"] = p
    maker = threading.Thread(target=port, daemon=True)
    for i in range(len(cluster.replicas)):
        t = time.monotonic()
        stopping = threading.Thread(target=cluster.restart, args=(i,))
        stopping.start()
        if i == 0:
            maker.start()
        stopping.join()
        answers.append(round(time.monotonic() - t, 3))
        cluster.wait_settled()
        steps.append(round(time.monotonic() - t, 3))
    maker.join(SETTLE_TIMEOUT_S)
    if "port" in result:
        probe.remove(result.pop("port"), vif)
    return {"event": "rolling", "restart_s": steps, "answers_s": answers, "total_s": round(time.monotonic() - t0, 3),
            **result}


def stop_postgres(cluster: Cluster, probe: Probe, pg, seconds: float) -> dict:
    """PostgreSQL stopped for `seconds`, then started again; seconds from its return to every replica
    live, and to the flows of a port created then on the switch."""
    t0 = time.monotonic()
    pg.halt()
    time.sleep(seconds)
    pg.resume()
    back = time.monotonic()
    cluster.wait_settled()
    settled = time.monotonic() - back
    vif = probe.plug()
    port = probe.create(vif)
    applied = time.monotonic() - back if probe.applied(vif) else None
    probe.remove(port, vif)
    return {"event": "postgres", "down_s": round(back - t0, 3), "settled_s": round(settled, 3),
            "applied_s": applied}


# ---------------------------------------------------------------------------------------------- the run

def run(repeat: int = 10, events: tuple[str, ...] = EVENTS, pause: float = 30.0, pg_down: float = 10.0,
        writers: int = 8, lab_name: str = "bha", replicas: int = 3, progress=lambda msg: None,
        logs: Path | None = None) -> dict:
    """The whole bench (see the module's text); the lab's logs are copied to `logs` at the end."""
    from fathom.bench.postgres import PostgresServer
    from fathom.cluster.leases import Timing
    from fathom.lab.lab import Lab
    from fathom.lab.topology import load
    from fathom.auth.client import read_token_file

    env, activity = environment(), [machine_activity(("fathom bench ha",))]
    pg = PostgresServer(durable=True).start()
    lab = Lab(lab_name)
    lab.down()
    try:
        progress(f"lab {lab_name}: {replicas} replicas on PostgreSQL")
        lab.up(load(TOPOLOGY), str(TOPOLOGY), standalone=False, db=pg.new_database(), replicas=replicas)
        state = lab.state()
        token = read_token_file(state["controller"]["token_file"])
        cluster = Cluster(lab, token)
        doc = measure(lab, cluster, pg, repeat, events, pause, pg_down, writers, progress)
        cluster.close()
    finally:
        if logs is not None:
            for log in lab.dir.rglob("*.log") if lab.dir.exists() else ():
                target = logs / log.relative_to(lab.dir)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log, target)
        lab.down()
        pg.stop()
    activity.append(machine_activity(("fathom bench ha",)))
    t = Timing()
    return {"environment": env, "machine_activity": activity, "lab": {"topology": str(TOPOLOGY), "replicas": replicas},
            "timing": {"renew_s": t.renew, "lease_s": t.lease, "guard_s": t.guard},
            "targets": {"kill_applied_p50_s": TARGET_P50_S, "kill_applied_p99_s": TARGET_P99_S},
            "options": {"repeat": repeat, "events": list(events), "pause_s": pause, "pg_down_s": pg_down,
                        "writers": writers},
            **doc}


def measure(lab, cluster: Cluster, pg, repeat: int, events, pause: float, pg_down: float, writers: int,
            progress=lambda msg: None, pings=None, node: str = "c1", network: str = "blue") -> dict:
    """The events on a running lab under `cluster`, with pings (`pings`: (vm, ip) pairs; default the
    topology's) and writers throughout. Returns the results (events, echoes, writes)."""
    api = cluster.api
    nodes = {n["name"]: n for n in api.list("/nodes")}
    from fathom.model import datapath_id
    switch = f"{datapath_id(nodes[node]['id']):016x}"
    nets = {n["name"]: n for n in api.list("/networks")}
    cidr = next(s["cidr"] for s in api.list("/subnets") if s["network_id"] == nets[network]["id"])
    prefix = cidr.rsplit(".", 1)[0]
    cluster.wait_settled()
    probe = Probe(lab, api, network, nets[network]["id"], node, f"{prefix}.100")
    probe.stock(repeat * len(events))
    pingers = [Pinger(lab, vm, ip) for vm, ip in (pings or PINGS)]
    writing = Writers([r["url"] for r in cluster.replicas], cluster.token, nets[network]["id"], writers,
                      f"{prefix}.{255 - writers}").start() if writers else None
    timeline = []
    try:
        time.sleep(1.0)
        for r in range(repeat):
            for event in events:
                progress(f"round {r + 1}/{repeat}: {event}")
                at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())   # to find the event in the logs
                if event == "kill":
                    timeline.append(kill_master(cluster, probe, switch))
                elif event == "pause":
                    timeline.append(pause_master(cluster, probe, node, switch, pause))
                elif event == "rolling":
                    timeline.append(rolling_restart(cluster, probe))
                elif event == "postgres":
                    timeline.append(stop_postgres(cluster, probe, pg, pg_down))
                timeline[-1]["at"] = at
                progress(f"  {timeline[-1]}")
    finally:
        writes = writing.stop() if writing else Writes()
        echoes = {p.name: p.stop() for p in pingers}
        probe.unplug()
    missing = writing.missing(api) if writing else []
    if writing:
        writing.close()
    kills = [e["applied_s"] for e in timeline if e["event"] == "kill" and e.get("applied_s") is not None]
    return {
        "events": timeline,
        "kill_applied_s": dist(kills),
        "kill_lease_s": dist([e["lease_s"] for e in timeline if e["event"] == "kill" and e.get("lease_s") is not None]),
        "echoes": {name: {"sent": sent, "lost": len(lost), "lost_seq": lost[:50]} for name, (sent, lost) in echoes.items()},
        "writes": {"created": len(writes.created), "deleted": len(writes.deleted), "answers": writes.answers,
                   "retried_ok": writes.retried_ok, "given_up": writes.given_up, "missing": missing,
                   "5xx_not_503": {k: n for k, n in writes.five_hundreds().items() if k != "503"}},
    }


# pings across nodes on one network, and across the router (TOPOLOGY's VMs)
PINGS = (("vm1", "198.19.45.12"), ("vm2", "198.19.45.11"), ("vm1", "198.19.46.13"), ("vm3", "198.19.45.11"))


def markdown(doc: dict) -> str:
    k = doc["kill_applied_s"]
    t = doc["timing"]
    lines = [f"# fathom bench ha ({doc['lab']['replicas']} replicas; lease {t['lease_s']} s, renewal every "
             f"{t['renew_s']} s, guard {t['guard_s']} s)", ""]
    if k.get("n"):
        lines += [f"kill -> new master applied: p50 {k['p50']:.2f} s (target <= {TARGET_P50_S}), "
                  f"p99 {k['p99']:.2f} s (target <= {TARGET_P99_S}), n {k['n']}", ""]
    lines += ["| event | replica | lease moved s | flows on the switch s | notes |", "|---|---|---|---|---|"]
    for e in doc["events"]:
        notes = ", ".join(f"{key} {e[key]}" for key in ("not_master_answers", "in_sync", "restart_s", "answers_s",
                                                        "down_s", "settled_s") if key in e)
        lines.append(f"| {e['event']} | {e.get('replica', '')} | {_s(e.get('lease_s'))} | {_s(e.get('applied_s'))} "
                     f"| {notes} |")
    lost = sum(x["lost"] for x in doc["echoes"].values())
    sent = sum(x["sent"] for x in doc["echoes"].values())
    w = doc["writes"]
    lines += ["", f"echoes lost: {lost} of {sent}; writes: {w['created']} created, {w['deleted']} deleted, "
              f"answers {w['answers']}, missing {len(w['missing'])}, 5xx other than 503: {w['5xx_not_503'] or 0}"]
    return "\n".join(lines) + "\n"


def _s(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def plot(doc: dict, path: Path) -> None:
    """Each event's timeline as an SVG: a row per event, from the event (0 s) to the lease moving
    (circle) and the new master's first change on the switch (square); the kill targets dashed."""
    from xml.sax.saxutils import escape
    rows = [e for e in doc["events"] if e.get("applied_s") is not None or e.get("lease_s") is not None]
    span = max([TARGET_P99_S] + [v for e in rows for v in (e.get("lease_s"), e.get("applied_s")) if v is not None])
    left, width, row_h, top = 110, 560, 18, 30
    scale = width / (span * 1.05)
    height = top + row_h * len(rows) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="16">{escape("event → lease moved (○) → first change on the switch (□), seconds")}</text>']
    for target in (TARGET_P50_S, TARGET_P99_S):
        x = left + target * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height - 30}" stroke="#c33" '
                   f'stroke-dasharray="4 3"/><text x="{x + 2:.1f}" y="{height - 18}" fill="#c33">{target:g} s</text>')
    for i, e in enumerate(rows):
        y = top + i * row_h + row_h / 2
        label = e["event"] + (f" r{e['replica']}" if "replica" in e else "")
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>')
        end = max(v for v in (e.get("lease_s"), e.get("applied_s")) if v is not None)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + end * scale:.1f}" y2="{y:.1f}" stroke="#999"/>')
        if e.get("lease_s") is not None:
            out.append(f'<circle cx="{left + e["lease_s"] * scale:.1f}" cy="{y:.1f}" r="4" fill="none" stroke="#36c"/>')
        if e.get("applied_s") is not None:
            x = left + e["applied_s"] * scale
            out.append(f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="#393"/>')
    for s in range(int(span * 1.05) + 1):
        x = left + s * scale
        out.append(f'<line x1="{x:.1f}" y1="{height - 32}" x2="{x:.1f}" y2="{height - 28}" stroke="#000"/>'
                   f'<text x="{x:.1f}" y="{height - 6}" text-anchor="middle">{s}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
