"""`fathom bench scale`, API create rate: concurrent writers create ports through the REST API (HTTP
on loopback) of a real `fathom controller`, on SQLite and on PostgreSQL (a private server with its
default durability); ports/s, p50/p99 per call, and the CPU per port of the controller, the writers
and the database server."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from fathom.bench import procs
from fathom.bench.report import dist
from fathom.client import ApiError

from .common import Controller

SAMPLE_S = 0.2      # how often every thread's schedstat is read (a thread that ends loses at most this)


def api_rate(ctl: Controller, writers: int = 8, ports: int = 2000, shared_network: bool = True,
             progress=lambda msg: None, store_pid: int | None = None) -> dict:
    """`writers` threads, each with its own connection, create `ports` ports in all (bound to a node,
    one address allocated from the subnet each); ports/s over the wall time and per-call latency.

    `shared_network`: every writer creates in one network (the worst case: allocations in one
    network are serialised); otherwise each writer has its own network (tenants side by side).

    The control plane's CPU per created port (`control_plane_cpu_ms_per_port`, by part in
    `schedstat_ms_per_port`) is the scheduler's count of every thread of the controller and its API
    workers and, with `store_pid` (a PostgreSQL postmaster), of the server and its backends
    (procs.ThreadCpu: sampled every SAMPLE_S, so a backend or thread born or ended in the run counts);
    the writers are the load generator, apart. `cpu_ms_per_port` is the older reading from /proc
    ticks, kept to compare: the controller, the writers (their threads' CPU time: HTTP client and
    JSON) and PostgreSQL's processes alive at the end (it misses a backend that ended in the run).
    """
    api = ctl.api
    tag = f"w{int(time.time() * 1000) % 10**8}"
    node = api.post("/nodes", json={"name": f"{tag}-node", "management_ip": "127.0.0.1", "tunnel_ip": "127.0.0.1"})
    nets = []
    for i in range(1 if shared_network else writers):
        net = api.post("/networks", json={"name": f"{tag}-net{i}", "type": "vxlan"})
        api.post("/subnets", json={"network_id": net["id"], "cidr": f"10.{100 + i}.0.0/16"})
        nets.append(net["id"])
    per_writer = ports // writers
    latencies: list[list[float]] = [[] for _ in range(writers)]
    client_cpu = [0.0] * writers
    errors: list[str] = []
    start = threading.Barrier(writers + 1)

    def writer(w: int) -> None:
        client = ctl.client()
        net = nets[w % len(nets)]
        try:
            start.wait()
            cpu0 = time.thread_time()
            for i in range(per_writer):
                t0 = time.perf_counter()
                try:
                    client.post("/ports", json={"network_id": net, "name": f"{tag}-{w}-{i}", "node": node["name"],
                                                "interface_name": f"if{w}x{i}"})
                except ApiError as e:
                    errors.append(str(e))
                latencies[w].append((time.perf_counter() - t0) * 1000)
            client_cpu[w] = time.thread_time() - cpu0
        finally:
            client.close()

    threads = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(writers)]
    for t in threads:
        t.start()
    cpu0 = ctl.cpu()
    store0 = _tree_cpu(store_pid) if store_pid else {}
    sched = procs.ThreadCpu({"controller": ctl.proc.pid, **({"postgresql": store_pid} if store_pid else {})},
                            every=SAMPLE_S, label=_part(ctl.proc.pid, store_pid)).start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    threads_cpu = sched.stop()
    cpu = ctl.cpu() - cpu0
    store_cpu = (sum(v - store0.get(p, 0.0) for p, v in _tree_cpu(store_pid).items())
                 if store_pid else None)
    done = writers * per_writer - len(errors)
    every = [x for lat in latencies for x in lat]
    progress(f"api: {done} ports in {wall:.1f} s = {done / wall:.0f}/s")
    per_port = {"controller": cpu, "writers": sum(client_cpu), "postgresql": store_cpu}
    per_port = {k: 1000 * v / done for k, v in per_port.items() if v is not None and done}
    total = sum(per_port.values())
    parts = {k: v / done for k, v in sorted(threads_cpu["ms"].items())} if done else {}
    control = sum(parts.values())
    return {"writers": writers, "ports": done, "errors": errors[:10], "n_errors": len(errors),
            "shared_network": shared_network, "seconds": wall, "ports_per_second": done / wall,
            "per_call_ms": dist(every), "controller_cpu_s": cpu,
            "controller_cpu_ms_per_port": per_port.get("controller"), "cpu_ms_per_port": per_port,
            "control_plane_cpu_ms_per_port": control, "schedstat_ms_per_port": parts,
            "schedstat_threads_born": threads_cpu["born"], "schedstat_threads_ended": threads_cpu["ended"],
            "schedstat_every_s": SAMPLE_S,
            "control_plane_ports_per_core_second": 1000 / control if control else None,
            "machine_ceiling_ports_per_second": 1000 * (os.cpu_count() or 1) / total if total else None}


def _part(controller: int, store: int | None):
    """What a thread is, for schedstat_ms_per_port: the controller's event loop (its main thread),
    its other threads (the store writes' pool, the reconciler, OpenFlow), its API worker processes,
    PostgreSQL's backends (one per connection: the SQL) and its other processes."""
    def label(group: str, pid: int, tid: int) -> str:
        if group == "controller":
            if pid != controller:
                return "api workers"
            return "controller event loop" if tid == pid else "controller other threads"
        if pid == store:
            return "postgresql postmaster"
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = ""
        return "postgresql backends" if "[local]" in cmd or "127.0.0.1" in cmd else "postgresql other"
    return label


def _tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of a process and each of its descendants (a PostgreSQL server's backends)."""
    return {p: c for p in (pid, *procs.children(pid)) if (c := procs.cpu_seconds(p)) is not None}
