"""`fathom bench scale`, cluster: controller replicas (`fathom controller --cluster`) on one
PostgreSQL server over N simulated switches (fathom.bench.ofswitch, a real ovsdb-server per node).

Each switch connects to the targets its node's OVSDB names (the replicas write them), answers role
requests as OVS does, and acknowledges each OVSDB write as ovs-vswitchd would. Measured:

- the lease shares once every replica started: the time until they are fair (every switch held by
  a live replica, the counts differing by one at most: docs/ha.md) and each replica's count;
- the CPU at rest (`idle_s` seconds, nothing changing, once no reconcile pass ran and no lease
  moved for QUIET_S) of the replicas, of PostgreSQL and of the
  switches, against one controller (not a cluster) over the same switches on the same store;
- one replica stopped (SIGTERM, then SIGKILL) and started again: seconds until the shares are fair
  again, and the lease changes (takes: each raises a lease's epoch by one) from the event until
  `HOLD_S` after that, against the fewest that would do (the switches that had to move).
"""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from fathom.bench import procs

from .common import Controller, all_active, create_parallel
from .fabric import Fleet, NodeOvsdb, Size, layout, loopback_net, management_ip, vm_interface

HOLD_S = 5.0          # after the shares are fair: watched that long for further changes (flapping)
POLL_S = 0.1
TARGET_SETTLE_S = 5.0
QUIET_S = 5.0        # before CPU at rest: that long without a reconcile pass or a lease change
TARGET_REST_RATIO = 3.0


def balance(status: dict, switches: int = 0) -> dict:
    """The shares in a GET /v1/cluster answer: each live replica's leases (`held`), the switches no
    live replica holds (`masterless`), the epochs' sum (it grows by one with each take) and whether
    the shares are `fair`: a lease for each of the `switches` there are, every one held by a live
    replica, the counts differing by one at most."""
    held = {r["id"]: 0 for r in status["replicas"] if r["live"]}
    masterless = 0
    for lease in status["leases"]:
        if lease["holder"] in held:
            held[lease["holder"]] += 1
        else:
            masterless += 1
    counts = list(held.values())
    return {"live": len(held), "held": held, "masterless": masterless,
            "epochs": sum(lease["epoch"] for lease in status["leases"]),
            "fair": (bool(counts) and masterless == 0 and len(status["leases"]) >= switches
                     and max(counts) - min(counts) <= 1)}


def wait_fair(api, replicas: int, switches: int, since: float, timeout: float = 120.0) -> dict:
    """Poll GET /v1/cluster until `replicas` replicas are live and their shares of `switches` fair;
    then watch HOLD_S more. Seconds from `since` (monotonic), the shares, and whether they stayed fair."""
    deadline = time.monotonic() + timeout
    while True:
        b = balance(api.get("/cluster"), switches)
        if b["live"] == replicas and b["fair"]:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"shares not fair within {timeout:g} s: {b}")
        time.sleep(POLL_S)
    fair_s = time.monotonic() - since
    stayed = True
    end = time.monotonic() + HOLD_S
    while time.monotonic() < end:
        time.sleep(POLL_S * 5)
        last = balance(api.get("/cluster"), switches)
        stayed = stayed and last["live"] == replicas and last["fair"]
    return {"fair_seconds": fair_s, "held": b["held"], "held_after_hold": last["held"], "stayed_fair": stayed,
            "epochs": last["epochs"]}


def wait_quiet(controllers: list[Controller], api, timeout: float = 180.0) -> float:
    """Wait until no controller ran a reconcile pass and no lease moved for QUIET_S (a replica that
    just gained its share resyncs it first); the seconds waited."""
    t0 = time.monotonic()
    last, since = None, t0
    while time.monotonic() - t0 < timeout:
        now = ([c.api.get("/health")["passes"] for c in controllers],
               balance(api.get("/cluster"))["epochs"] if any(c.cluster for c in controllers) else 0)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= QUIET_S:
            break
        time.sleep(POLL_S * 5)
    return time.monotonic() - t0


def _cpu(pids: list[int]) -> float:
    return sum(procs.cpu_seconds(p) or 0.0 for p in pids)


def _reaped(pid: int) -> float:
    """CPU seconds of pid's children that ended and that it waited for (cutime + cstime)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[13]) + int(fields[14])) / procs.CLK_TCK


def at_rest(controllers: list[Controller], pg_pid: int, fleet: Fleet, idle_s: float) -> dict:
    """CPU seconds per second of wall time over `idle_s` idle seconds: the controllers (with any
    worker processes), PostgreSQL (server and backends), the simulated switches."""
    def pids():
        return ([p for c in controllers for p in (c.proc.pid, *procs.children(c.proc.pid))],
                [pg_pid, *procs.children(pg_pid)])
    ctl, pg = pids()
    c0, f0, t0 = _cpu(ctl), fleet.cpu(), time.monotonic()
    pg0, r0 = {p: procs.cpu_seconds(p) or 0.0 for p in pg}, _reaped(pg_pid)
    time.sleep(idle_s)
    ctl2, pg2 = pids()
    if set(ctl2) != set(ctl):
        # a process came or went meanwhile: count the ones that were there throughout
        ctl = [p for p in ctl if p in ctl2]
    wall = time.monotonic() - t0
    c = _cpu(ctl) - c0
    # every PostgreSQL process: those there at the end (a new one from its start), and the
    # postmaster's children that ended meanwhile (an autovacuum worker lives a fraction of a second),
    # from the CPU of the children it waited for, less what they had used before
    pg1 = {p: procs.cpu_seconds(p) or 0.0 for p in pg2}
    p = (sum(v - pg0.get(q, 0.0) for q, v in pg1.items())
         + max(0.0, _reaped(pg_pid) - r0 - sum(v for q, v in pg0.items() if q not in pg1)))
    return {"seconds": wall, "controllers_cpu_per_s": c / wall, "postgresql_cpu_per_s": p / wall,
            "switches_cpu_per_s": (fleet.cpu() - f0) / wall, "total_cpu_per_s": (c + p) / wall}


def cluster_run(run_dir: Path, db_url: str, pg_pid: int, replicas: int = 3, switches: int = 100,
                ports_per_node: int = 2, idle_s: float = 60.0, progress=lambda msg: None) -> dict:
    """One controller, then `replicas` replicas, over `switches` simulated nodes on the store at
    `db_url` (a PostgreSQL server whose postmaster is `pg_pid`); see the module's docstring."""
    from fathom.model import datapath_id
    run_dir.mkdir(parents=True, exist_ok=True)
    size = Size(switches, ports_per_node)
    single = Controller(run_dir / "single", db_url).start()
    reps: list[Controller] = []
    ovsdbs: list[NodeOvsdb] = []
    fleet = None
    out: dict = {"replicas": replicas, "switches": switches, "ports_per_node": ports_per_node, "idle_s": idle_s,
                 "hold_s": HOLD_S}
    try:
        api = single.api
        progress(f"cluster: {switches} ovsdb-servers and nodes under one controller")
        net = loopback_net(run_dir)
        nodes = []
        for i in range(switches):
            node = api.post("/nodes", json={"name": f"s{i}", "management_ip": management_ip(i, net),
                                            "tunnel_ip": f"10.99.{i >> 8}.{(i & 0xFF) + 1}"})
            nodes.append(node)
            ovsdbs.append(NodeOvsdb(run_dir / "nodes", i, datapath_id(node["id"]), node["tunnel_ip"],
                                    f"tcp:127.0.0.1:{single.of_port}", ports_per_node, net))
        dpids = [datapath_id(n["id"]) for n in nodes]
        fleet = Fleet()
        answer = fleet.call(op="connect", dpids=dpids, timeout=180,
                            ovsdb={str(d): f"tcp:{o.ip}:6640" for d, o in zip(dpids, ovsdbs)})
        if answer["not_ready"]:
            raise RuntimeError(f"switches not admitted: {answer['not_ready'][:5]}")
        ports = layout(size)
        networks = []
        for k in range(max(p[2] for p in ports) + 1):
            n = api.post("/networks", json={"name": f"net{k}", "type": "vxlan"})
            api.post("/subnets", json={"network_id": n["id"], "cidr": f"10.{k >> 6}.{(k & 63) * 4}.0/22"})
            networks.append(n["id"])
        create_parallel(single, [{"network_id": networks[k], "name": f"p{n}-{j}", "node": f"s{n}",
                                  "interface_name": vm_interface(j)} for n, j, k in ports])
        all_active(api)
        quiet = wait_quiet([single], api)
        progress(f"cluster: one controller at rest, {idle_s:g} s (quiet after {quiet:.1f} s)")
        out["single_at_rest"] = {"quiet_after_seconds": quiet, **at_rest([single], pg_pid, fleet, idle_s)}
        single.stop()

        progress(f"cluster: {replicas} replicas")
        reps = [Controller(run_dir / f"replica{i}", db_url, cluster=True) for i in range(replicas)]
        t0 = time.monotonic()
        _start_all(reps)
        up = time.monotonic() - t0
        api = reps[0].api
        start = wait_fair(api, replicas, switches, t0, timeout=300)
        out["start"] = {"all_answering_seconds": up, **start}
        out["start"]["switches"] = _roles(fleet, api)
        progress(f"cluster: fair after {start['fair_seconds']:.1f} s: {sorted(start['held'].values())}; "
                 f"at rest, {idle_s:g} s")
        quiet = wait_quiet(reps, api)
        progress(f"cluster: replicas at rest, {idle_s:g} s (quiet after {quiet:.1f} s)")
        e0 = balance(api.get("/cluster"))["epochs"]
        out["cluster_at_rest"] = {"quiet_after_seconds": quiet, **at_rest(reps, pg_pid, fleet, idle_s)}
        out["cluster_at_rest"]["lease_changes"] = balance(api.get("/cluster"))["epochs"] - e0
        single_total = out["single_at_rest"]["total_cpu_per_s"]
        out["rest_ratio"] = out["cluster_at_rest"]["total_cpu_per_s"] / single_total if single_total else None
        single_ctl = out["single_at_rest"]["controllers_cpu_per_s"]
        out["rest_ratio_controllers"] = (out["cluster_at_rest"]["controllers_cpu_per_s"] / single_ctl
                                         if single_ctl else None)

        out["events"] = []
        victim = reps[-1]
        for how in ("SIGTERM", "SIGKILL"):
            before = balance(api.get("/cluster"))
            lost = before["held"].get(_replica_id(api, victim), 0)
            progress(f"cluster: {how} of a replica holding {lost} leases")
            t = time.monotonic()
            victim.proc.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGKILL)
            left = wait_fair(api, replicas - 1, switches, t)
            victim.proc.wait(30)
            out["events"].append({"event": how, "leases_of_the_stopped": lost,
                                  "lease_changes": left["epochs"] - before["epochs"],
                                  "switches": _roles(fleet, api), **left})
            progress(f"cluster: {how}: fair after {left['fair_seconds']:.2f} s, "
                     f"{left['epochs'] - before['epochs']} lease changes")
            before = balance(api.get("/cluster"))
            t = time.monotonic()
            victim.api = None
            victim.start()
            answering = time.monotonic() - t
            back = wait_fair(api, replicas, switches, t)
            joined = back["held"].get(_replica_id(api, victim), 0)
            out["events"].append({"event": f"start after {how}", "answering_seconds": answering,
                                  "fair_after_answering_seconds": back["fair_seconds"] - answering,
                                  "leases_of_the_started": joined,
                                  "lease_changes": back["epochs"] - before["epochs"],
                                  "switches": _roles(fleet, api), **back})
            progress(f"cluster: started again: answering after {answering:.1f} s, fair after "
                     f"{back['fair_seconds']:.2f} s, {back['epochs'] - before['epochs']} lease changes")
        return out
    finally:
        if fleet is not None:
            fleet.stop()
        for c in (single, *reps):
            c.stop()
        for o in ovsdbs:
            o.stop()


def _start_all(controllers: list[Controller]) -> None:
    """Start every controller at once (each start waits for its API)."""
    errors: list[Exception] = []

    def one(c):
        try:
            c.start()
        except Exception as e:  # noqa: BLE001 - raised below
            errors.append(e)
    threads = [threading.Thread(target=one, args=(c,)) for c in controllers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _replica_id(api, ctl: Controller) -> str | None:
    """The cluster's id of the live replica whose OpenFlow listener is `ctl`'s (a replica stopped
    before it may still have a row there)."""
    listener = f"127.0.0.1:{ctl.of_port}"
    return next((r["id"] for r in api.get("/cluster")["replicas"] if r["openflow"] == listener and r["live"]), None)


def _roles(fleet: Fleet, api) -> dict:
    """The switches' own view: how many have exactly one master connection whose generation_id is
    their lease's epoch, and how many connections they hold in all."""
    roles = fleet.call(op="roles")
    epochs = {int(x["switch"], 16): x["epoch"] for x in api.get("/cluster")["leases"]}
    one = sum(1 for d, r in roles.items() if r["masters"] == 1 and r["generation"] == epochs.get(int(d)))
    return {"one_master_at_its_epoch": one, "of": len(roles),
            "connections": sum(r["connections"] for r in roles.values())}
