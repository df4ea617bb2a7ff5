"""`fathom bench scale`: the controller at scale, against simulated switches and a real store.

Four measurements, each against real `fathom controller` processes, one module each:

- **API create rate** (`api`): concurrent writers create ports through the REST API, on SQLite and
  on PostgreSQL.
- **Fabric scale** (`fabric`): simulated nodes at 10, 1,000 and 10,000 ports: port-up latency, the
  controller's CPU time per change, and a full resync of every wiped switch.
- **Full resync of a real OVS bridge** (`resync`): a lab whose controller speaks OpenFlow and
  OVSDB over TLS, as on real hosts.
- **Replicas** (`cluster`): `fathom controller --cluster` replicas on one PostgreSQL over simulated
  switches: the lease shares, their return to fair after a replica leaves or joins, and the CPU at
  rest against one controller.

This module runs the plan and reports: progress goes to `progress(msg)`; every figure comes back as
one JSON-able document.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .api import api_rate
from .cluster import cluster_run
from .common import RUN_ROOT, Controller
from .fabric import Size, fabric_run, parse_sizes
from .resync import resync_real

__all__ = ["RUN_ROOT", "Plan", "markdown", "parse_sizes", "plot", "run"]


@dataclass
class Plan:
    sizes: list[Size]
    samples: int = 20                       # timed new ports per fabric size
    api_ports: int = 2000                   # ports per API-rate run
    writers: int = 8
    stores: tuple[str, ...] = ("sqlite", "postgresql")
    api_workers: tuple[int, ...] = (1,)     # API processes of the controller (PostgreSQL runs)
    resync_ports: int = 10000               # ports of the real-OVS resync (0: skip)
    lab: str = "bsc"
    parts: tuple[str, ...] = ("api", "fabric", "resync", "cluster")
    replicas: int = 3                       # cluster part: replicas, simulated switches, idle seconds
    cluster_switches: int = 100
    idle_s: float = 60.0

    def to_dict(self) -> dict:
        return {**self.__dict__, "sizes": [str(s) for s in self.sizes]}


def run(plan: Plan, run_dir: Path, progress=lambda msg: None) -> dict:
    """Every part of the plan in turn; the results document (figures, environment, plan)."""
    from fathom.bench.postgres import PostgresServer
    from fathom.bench.report import busy, environment, machine_activity
    own = (str(run_dir), f"/{plan.lab}/")
    env = environment()
    env["machine_at_start"] = machine_activity(own)
    doc: dict = {"benchmark": "scale", "plan": plan.to_dict(), "environment": env}
    t0 = time.time()
    if "api" in plan.parts:
        doc["api"] = []
        runs = [(store, shared, workers) for store in plan.stores for shared in (True, False)
                for workers in (plan.api_workers if store == "postgresql" else (1,))]
        for store, shared, workers in runs:
            pg = None
            try:
                if store == "postgresql":
                    pg = PostgresServer(durable=True).start()
                    url = pg.new_database()
                else:
                    for f in (run_dir / "api").glob("fathom.db*"):
                        f.unlink()
                    url = f"sqlite:///{run_dir}/api/fathom.db"
                progress(f"api: {plan.writers} writers on {store}, {workers} API process(es), "
                         f"{'one network' if shared else 'a network each'}")
                ctl = Controller(run_dir / "api", url, api_workers=workers).start()
                try:
                    r = api_rate(ctl, plan.writers, plan.api_ports, shared, progress,
                                 store_pid=pg.pid() if pg else None)
                finally:
                    ctl.stop()
                doc["api"].append({"store": store, "api_workers": workers,
                                   "durability": "PostgreSQL defaults (fsync on)" if pg else
                                   "SQLite WAL, synchronous=FULL (Python's default)", **r})
            finally:
                if pg is not None:
                    pg.stop()
    if "fabric" in plan.parts:
        doc["fabric"] = []
        for size in plan.sizes:
            try:
                doc["fabric"].append(fabric_run(run_dir / "fabric", size, plan.samples, progress=progress))
            except Exception as e:  # noqa: BLE001 - one size failing keeps the others' figures
                progress(f"{size}: failed: {e}")
                doc.setdefault("failed", []).append({"size": str(size), "error": f"{type(e).__name__}: {e}"})
    if "resync" in plan.parts and plan.resync_ports:
        doc["resync_real"] = resync_real(plan.lab, plan.resync_ports, progress=progress)
    if "cluster" in plan.parts:
        pg = PostgresServer(durable=True).start()
        try:
            doc["cluster"] = cluster_run(run_dir / "cluster", pg.new_database(), pg.pid(), plan.replicas,
                                         plan.cluster_switches, idle_s=plan.idle_s, progress=progress)
        finally:
            pg.stop()
    env["loadavg_at_end"] = os.getloadavg()
    env["machine_at_end"] = machine_activity(own)
    env["contended"] = busy([env["machine_at_start"], env["machine_at_end"]])
    doc["elapsed_s"] = time.time() - t0
    return doc


def markdown(doc: dict) -> str:
    lines = []
    env = doc["environment"]
    if env.get("contended"):
        lines.append(f"**Crowded machine**: load average {env['loadavg_at_start'][0]:.1f} at the start, "
                     f"{env['loadavg_at_end'][0]:.1f} at the end; other engineers' tests ran beside it.\n")
    if doc.get("api"):
        lines += ["| store | API processes | writers | networks | ports | ports/s | p50 ms | p99 ms | control-plane CPU "
                  "ms/port (schedstat): controller processes / PostgreSQL / both | /proc ticks: controller / writers / "
                  "PostgreSQL |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in doc["api"]:
            d, c = r["per_call_ms"], r.get("cpu_ms_per_port", {})
            ticks = " / ".join(f"{c[k]:.1f}" if k in c else "–" for k in ("controller", "writers", "postgresql"))
            parts = r.get("schedstat_ms_per_port") or {}
            ctl = sum(v for k, v in parts.items() if not k.startswith("postgresql"))
            pg = sum(v for k, v in parts.items() if k.startswith("postgresql"))
            sched = f"{ctl:.1f} / {pg:.1f} / {ctl + pg:.1f}" if parts else "–"
            lines.append(f"| {r['store']} | {r.get('api_workers', 1)} | {r['writers']} | {'one' if r['shared_network'] else 'one each'} | "
                         f"{r['ports']} | {r['ports_per_second']:.0f} | {d['p50']:.1f} | {d['p99']:.1f} | "
                         f"{sched} | {ticks} |")
        lines.append("")
    if doc.get("fabric"):
        lines += ["| fabric (nodes x ports) | ports | flows | port-up p50 ms | p99 ms | controller CPU ms/change | "
                  "full resync s | flows/s | resync CPU s | in sync | controller RSS MB |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in doc["fabric"]:
            if "error" in r:
                continue
            rss = f"{r['controller_rss_mb']:.0f}" if r.get("controller_rss_mb") else ""
            lines.append(f"| {r['size']} | {r['ports']} | {r['resync_flows']} | {r['port_up_p50_ms']:.0f} | "
                         f"{r['port_up_p99_ms']:.0f} | {r['controller_cpu_ms_per_change']:.0f} | "
                         f"{r['resync_seconds']:.2f} | {r['resync_flows_per_second']:.0f} | "
                         f"{r['resync_controller_cpu_s']:.2f} | {r['switches_in_sync']}/{r['nodes']} | {rss} |")
        lines.append("")
    if doc.get("resync_real"):
        r = doc["resync_real"]
        lines += [f"Real OVS ({r['flows_on_bridge']} flows on one br-int, {r['ports']} ports):", "",
                  "| how | flows | seconds | flows/s | OVS reconnected after s | flows/s after it | "
                  "apply only flows/s | controller CPU s |", "|---|---|---|---|---|---|---|---|"]
        for x in r["runs"]:
            apply = f"{x['apply_flows_per_second']:.0f}" if x.get("apply_flows_per_second") else ""
            back = f"{x['reconnect_seconds']:.2f}" if "reconnect_seconds" in x else ""
            after = f"{x['after_reconnect_flows_per_second']:.0f}" if "after_reconnect_flows_per_second" in x else ""
            lines.append(f"| {x['how']} | {x['flows']} | {x['seconds']:.2f} | {x['flows_per_second']:.0f} | {back} | "
                         f"{after} | {apply} | {x['controller_cpu_s']:.2f} |")
        lines.append("")
    if doc.get("cluster"):
        lines += cluster_markdown(doc["cluster"])
    return "\n".join(lines)


def cluster_markdown(c: dict) -> list[str]:
    from .cluster import TARGET_REST_RATIO, TARGET_SETTLE_S
    s = c["start"]
    lines = [f"{c['replicas']} replicas over {c['switches']} simulated switches ({c['ports_per_node']} ports each), "
             f"one PostgreSQL:", "",
             "| event | seconds to fair shares | shares then | lease changes (fewest that would do) | "
             f"stayed fair {c['hold_s']:g} s | switches with one master at its epoch |",
             "|---|---|---|---|---|---|",
             f"| every replica started (all answering after {s['all_answering_seconds']:.1f} s) | "
             f"{s['fair_seconds']:.2f} | {' / '.join(str(v) for v in sorted(s['held'].values(), reverse=True))} | "
             f"– | {'yes' if s['stayed_fair'] else 'no'} | {s['switches']['one_master_at_its_epoch']}/{s['switches']['of']} |"]
    for e in c["events"]:
        fewest = e.get("leases_of_the_stopped", e.get("leases_of_the_started"))
        when = f"{e['fair_seconds']:.2f}"
        if "answering_seconds" in e:
            when += f" ({e['fair_after_answering_seconds']:.2f} after its API answered)"
        lines.append(f"| {e['event']} | {when} | "
                     f"{' / '.join(str(v) for v in sorted(e['held'].values(), reverse=True))} | "
                     f"{e['lease_changes']} ({fewest}) | {'yes' if e['stayed_fair'] else 'no'} | "
                     f"{e['switches']['one_master_at_its_epoch']}/{e['switches']['of']} |")
    one, many = c["single_at_rest"], c["cluster_at_rest"]
    lines += ["", f"CPU at rest ({c['idle_s']:g} s idle; CPU seconds per second; target: the cluster within "
                  f"{TARGET_REST_RATIO:g}x of one controller; fair shares within {TARGET_SETTLE_S:g} s):", "",
              "| | controllers | PostgreSQL | both | simulated switches | lease changes |", "|---|---|---|---|---|---|",
              f"| one controller | {one['controllers_cpu_per_s']:.3f} | {one['postgresql_cpu_per_s']:.3f} | "
              f"{one['total_cpu_per_s']:.3f} | {one['switches_cpu_per_s']:.3f} | – |",
              f"| {c['replicas']} replicas | {many['controllers_cpu_per_s']:.3f} | {many['postgresql_cpu_per_s']:.3f} | "
              f"{many['total_cpu_per_s']:.3f} | {many['switches_cpu_per_s']:.3f} | {many['lease_changes']} |",
              f"| ratio | {c['rest_ratio_controllers']:.2f} | | {c['rest_ratio']:.2f} | | |", ""]
    return lines


def plot(doc: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fabric = doc.get("fabric") or []
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    crowded = " (crowded machine)" if doc["environment"].get("contended") else ""
    if fabric:
        x = [r["ports"] for r in fabric]
        ax = axes[0]
        ax.plot(x, [r["port_up_p50_ms"] for r in fabric], "o-", label="p50")
        ax.plot(x, [r["port_up_p99_ms"] for r in fabric], "s--", label="p99")
        ax.set(xscale="log", yscale="log", xlabel="ports in the fabric", ylabel="ms",
               title="new port: API call → active")
        ax.legend()
        ax = axes[1]
        ax.plot(x, [r["controller_cpu_ms_per_change"] for r in fabric], "o-")
        ax.set(xscale="log", yscale="log", xlabel="ports in the fabric", ylabel="ms",
               title="controller CPU per new port")
        ax = axes[2]
        ax.plot(x, [r["resync_seconds"] for r in fabric], "o-", label="wall")
        ax.plot(x, [r["resync_controller_cpu_s"] for r in fabric], "s--", label="controller CPU")
        ax.set(xscale="log", yscale="log", xlabel="ports in the fabric", ylabel="s",
               title="full resync, every switch wiped")
        ax.legend()
    api = doc.get("api") or []
    ax = axes[3]
    if api:
        labels = [f"{r['store']} ×{r.get('api_workers', 1)}\n{'1 net' if r['shared_network'] else '8 nets'}"
                  for r in api]
        ax.bar(labels, [r["ports_per_second"] for r in api], color="#4c72b0")
        ax.axhline(500, color="r", ls=":", label="target 500/s")
        ax.set(ylabel="ports/s", title=f"API creates, {api[0]['writers']} writers")
        ax.legend()
    else:
        ax.axis("off")
    if not fabric:
        for ax in axes[:3]:
            ax.axis("off")
    fig.suptitle(f"fathom bench scale{crowded}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
