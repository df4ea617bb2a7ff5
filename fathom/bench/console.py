"""`fathom bench console`: how fast the web console is in a real browser and what it costs the
controller.

A `fathom controller` of its own (bench scale's, fathom.bench.scale.common.Controller: a SQLite
store, no switch connected, so ports stay pending) holding bench scale's model (fathom.bench.scale.
fabric.layout: NODES compute nodes with PORTS ports each, networks spanning ten nodes), made through
its API; headless Chromium (fathom.bench.browser) logged in as the admin. Figures:

- `first_page_ms`: the topology page opened on a lab-sized cloud (the first SMALL nodes and their
  ports, made first), from navigation start to the picture drawn with every port counted (the page
  usable), in the page's own clock (performance.now()); `samples` times. Target ≤ 1000 ms.
- `topology_ms`: the same at NODES × PORTS (the page usable: drawn with every port counted, per node;
  the ports are listed once a node is opened). Target ≤ 2000 ms. Then `responsive`: for LAG_S seconds
  the page's event loop is probed every 50 ms; `lag_ms` is how late each probe ran (a click waits
  that long at most). `node_ms`: a node opened (`?node=`), until its PORTS ports are in the table.
- `update_cpu_ms_per_console`: controller CPU (its process and children, /proc ticks: a worker thread
  that exited still counts) of UPDATES port renames with the topology page open and UPDATE_STREAMS
  change-notice streams held by plain HTTP clients besides (a page applies a notice without reading
  through the API: `page_api_calls_per_update` says so), less the same renames with the page alone,
  per rename and per stream: what one more console costs. Target ≤ 1 ms. `update_cpu_ms_page`: the
  renames with the page open less the same with no console (measured first), per rename: the notice
  worked out, read and encoded once, and one console.
- `rest_cpu_pct`: controller CPU over REST_S seconds with STREAMS streams open (a topology page at
  rest holds its stream and nothing else: no polling), less REST_S seconds with none, in % of one
  core. Target ≤ 1 %.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from fathom.bench.report import busy, dist, environment, machine_activity

TARGETS = {"first_page_ms": 1000.0, "topology_ms": 2000.0, "node_ms": 2000.0, "update_cpu_ms_per_console": 1.0, "rest_cpu_pct": 1.0}
SMALL = 3              # nodes of the lab-sized cloud (their ports: PORTS each, at most 4)
STREAMS = 10           # consoles open at rest
UPDATE_STREAMS = 50    # consoles added for the cost of a live update per console (the API serves 64 connections a source)
# the page's reads through the API so far (its stream of notices apart)
API_CALLS_JS = """return performance.getEntriesByType("resource")
  .filter(e => e.name.includes("/v1/") && !e.name.includes("/v1/events")).length;"""
LAG_S = 3.0
SETTLE_S = 3.0         # quiet before a CPU measurement (the pass and reads of what came before done)
# the page's clock when the topology is drawn with every port counted (the graph's data-ports), or
# with `rows` rows in the ports table (a node opened); null after `limit` s: not usable that soon
USABLE_JS = """
const want = arguments[0], rows = arguments[1], limit = arguments[2], done = arguments[arguments.length - 1];
(function look() {
  const drawn = Number(document.getElementById("graph").dataset.ports ?? -1);
  if (drawn >= want && document.querySelectorAll("#ports tbody tr").length >= rows) done(performance.now());
  else if (performance.now() > limit * 1000) done(null);
  else requestAnimationFrame(look);
})();"""
GIVE_UP_S = 60.0       # a page not usable after this long is recorded as such (None)
LAG_JS = """
const seconds = arguments[0], done = arguments[arguments.length - 1], late = [];
let expected = performance.now() + 50;
const probe = setInterval(() => {
  const now = performance.now(); late.push(Math.max(0, now - expected)); expected = now + 50;
}, 50);
setTimeout(() => { clearInterval(probe); done(late); }, seconds * 1000);"""


def run(run_dir: Path, nodes: int = 100, ports: int = 100, samples: int = 5, updates: int = 10,
        rest_s: float = 30.0, progress=lambda msg: None) -> dict:
    from fathom.bench.browser import headless_chromium
    from fathom.bench.scale.common import Controller
    from fathom.bench.scale.fabric import Size, layout

    env = environment()
    activity = [machine_activity(("fathom bench console",))]
    run_dir.mkdir(parents=True, exist_ok=True)
    for f in run_dir.glob("fathom.db*"):
        f.unlink()
    ctl = Controller(run_dir, f"sqlite:///{run_dir}/fathom.db").start()
    doc: dict = {"benchmark": "console", "plan": {"nodes": nodes, "ports_per_node": ports, "small_nodes": SMALL,
                                                  "samples": samples, "updates": updates, "streams": STREAMS,
                                                  "update_streams": UPDATE_STREAMS,
                                                  "rest_s": rest_s}}
    try:
        cloud = _Cloud(ctl, layout(Size(nodes, ports)))
        with headless_chromium(page_load_timeout=120) as browser:
            browser.set_script_timeout(300)
            browser.get(f"{ctl.url}/console/login")
            browser.execute_script("sessionStorage.setItem('fathom.token', arguments[0])", ctl.token)

            def usable(node: str | None = None) -> float:
                browser.get(f"{ctl.url}/console/topology" + (f"?node={node}" if node else ""))
                return browser.execute_async_script(USABLE_JS, cloud.ports, ports if node else 0, GIVE_UP_S)

            progress(f"a lab-sized cloud: {min(SMALL, nodes)} nodes, {min(ports, 4)} ports each")
            cloud.grow(min(SMALL, nodes), min(ports, 4))
            doc["first_page_ms"] = _times([usable() for _ in range(samples)])
            doc["small"] = {"nodes": cloud.nodes, "ports": cloud.ports}
            progress(f"bench scale's model: {nodes} nodes x {ports} ports")
            browser.get("about:blank")    # no console while the cloud is made
            t0 = time.monotonic()
            cloud.grow(nodes, ports)
            doc["model"] = {"nodes": cloud.nodes, "ports": cloud.ports, "networks": len(cloud.networks),
                            "made_s": round(time.monotonic() - t0, 1)}
            progress(f"{updates} port renames with no console open")
            time.sleep(SETTLE_S)
            without = cloud.renames(updates)
            progress(f"the topology of {cloud.ports} ports, {samples} times")
            doc["topology_ms"] = _times([usable() for _ in range(samples)])
            doc["lag_ms"] = dist(browser.execute_async_script(LAG_JS, LAG_S))
            progress(f"a node opened: its {ports} ports listed, {samples} times")
            doc["node_ms"] = _times([usable(f"s{nodes // 2}") for _ in range(samples)])
            errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            doc["page_errors"] = errors[:10]

            progress(f"{updates} port renames with the topology open")
            usable()
            time.sleep(SETTLE_S)
            calls = browser.execute_script(API_CALLS_JS)
            with_page = cloud.renames(updates)
            doc["page_api_calls_per_update"] = (browser.execute_script(API_CALLS_JS) - calls) / updates
            progress(f"{updates} port renames with the page and {UPDATE_STREAMS} change-notice streams open")
            with _Streams(ctl, UPDATE_STREAMS):
                with_streams = cloud.renames(updates)
            browser.get("about:blank")
        doc["update_cpu_ms_page"] = round((with_page - without) * 1000 / updates, 3)
        doc["update_cpu_ms_per_console"] = round((with_streams - with_page) * 1000 / updates / UPDATE_STREAMS, 4)
        doc["update_cpu_s"] = {"none": round(without, 4), "page": round(with_page, 4),
                               "page_and_streams": round(with_streams, 4)}
        time.sleep(SETTLE_S)
        progress(f"at rest: {rest_s:g} s with no console, {rest_s:g} s with {STREAMS} streams")
        idle = _cpu_over(ctl, rest_s)
        with _Streams(ctl, STREAMS):
            rest = _cpu_over(ctl, rest_s)
        doc["rest_cpu_s"] = {"none": round(idle, 4), "streams": round(rest, 4)}
        doc["rest_cpu_pct"] = round((rest - idle) * 100 / rest_s, 3)
    finally:
        ctl.stop()
    activity.append(machine_activity(("fathom bench console",)))
    return {**doc, "targets": TARGETS, "busy_machine": busy(activity), "environment": {**env, "machine": activity}}


def _times(ms: list) -> dict:
    """The distribution of the loads that became usable, and how many did not within GIVE_UP_S."""
    return {**dist([t for t in ms if t is not None]), "not_usable_within_s": GIVE_UP_S,
            "not_usable": sum(t is None for t in ms)}


class _Cloud:
    """Bench scale's layout made through the controller's API, part by part (`grow`)."""

    def __init__(self, ctl, layout: list[tuple[int, int, int]]):
        self.ctl, self.layout = ctl, layout
        self.nodes, self.ports, self.networks, self.made = 0, 0, {}, set()
        self.port_ids: list[int] = []

    def grow(self, nodes: int, ports: int) -> None:
        from fathom.bench.scale.common import create_parallel
        api = self.ctl.api
        for i in range(self.nodes, nodes):
            api.post("/nodes", json={"name": f"s{i}", "tunnel_ip": f"10.99.{i >> 8}.{(i & 0xFF) + 1}"})
        self.nodes = max(self.nodes, nodes)
        want = [(n, j, k) for n, j, k in self.layout if n < nodes and j < ports and (n, j) not in self.made]
        for k in sorted({k for _, _, k in want} - set(self.networks)):
            net = api.post("/networks", json={"name": f"net{k}", "type": "vxlan"})
            api.post("/subnets", json={"network_id": net["id"], "cidr": f"10.{k >> 6}.{(k & 63) * 4}.0/22"})
            self.networks[k] = net["id"]
        made = create_parallel(self.ctl, [{"network_id": self.networks[k], "name": f"p{n}-{j}", "node": f"s{n}",
                                           "interface_name": f"vm{j}"} for n, j, k in want])
        self.made |= {(n, j) for n, j, _ in want}
        self.port_ids += [p["id"] for p in made]
        self.ports = len(self.made)

    def renames(self, n: int, gap: float = 1.5) -> float:
        """Controller CPU seconds over `n` renames of a port, `gap` s apart (each pass, its notice
        and what the consoles read after it done before the next)."""
        api, port = self.ctl.api, self.port_ids[0]
        cpu0 = self.ctl.cpu()
        for i in range(n):
            api.patch(f"/ports/{port}", json={"name": f"renamed-{time.monotonic_ns()}-{i}"})
            time.sleep(gap)
        return self.ctl.cpu() - cpu0


def _cpu_over(ctl, seconds: float) -> float:
    cpu0 = ctl.cpu()
    time.sleep(seconds)
    return ctl.cpu() - cpu0


class _Streams:
    """`n` change-notice streams (GET /v1/events) held open by plain HTTP clients, read to the end."""

    def __init__(self, ctl, n: int):
        self.ctl, self.n = ctl, n
        self.stop = threading.Event()
        self.open = threading.Semaphore(0)
        self.threads: list[threading.Thread] = []

    def _hold(self) -> None:
        import httpx
        with httpx.Client(timeout=httpx.Timeout(10, read=None)) as c, \
                c.stream("GET", f"{self.ctl.url}/v1/events", headers={"Authorization": f"Bearer {self.ctl.token}"}) as r:
            self.open.release()
            for _ in r.iter_raw():
                if self.stop.is_set():
                    return

    def __enter__(self):
        self.threads = [threading.Thread(target=self._hold, daemon=True) for _ in range(self.n)]
        for t in self.threads:
            t.start()
        for _ in range(self.n):
            if not self.open.acquire(timeout=30):
                raise RuntimeError("a change-notice stream did not open within 30 s")
        time.sleep(1.0)       # their first reads are over
        return self

    def __exit__(self, *exc):
        self.stop.set()       # each ends at its next event or keep-alive; daemon threads otherwise


def markdown(doc: dict) -> str:
    plan, t = doc["plan"], doc["targets"]

    def row(name, d, target):
        if not d["n"]:
            return f"| {name} | not usable within {d['not_usable_within_s']:g} s | | | ≤ {target:g} |"
        return f"| {name} | {d['p50']:.0f} | {d['p99']:.0f} | {d['max']:.0f} | ≤ {target:g} |"
    return "\n".join([
        f"# fathom bench console: {plan['nodes']} nodes x {plan['ports_per_node']} ports",
        "",
        "| page usable, ms (navigation start → drawn, every port counted) | p50 | p99 | max | target |",
        "|---|---|---|---|---|",
        row(f"first page: {doc['small']['nodes']} nodes, {doc['small']['ports']} ports", doc["first_page_ms"],
            t["first_page_ms"]),
        row(f"topology: {doc['model']['nodes']} nodes, {doc['model']['ports']} ports", doc["topology_ms"],
            t["topology_ms"]),
        row(f"a node opened: its {plan['ports_per_node']} ports listed", doc["node_ms"], t["node_ms"]),
        "",
        f"Event loop lag after drawing the {doc['model']['ports']} ports: p50 {doc['lag_ms']['p50']:.0f} ms, "
        f"max {doc['lag_ms']['max']:.0f} ms; page errors: {len(doc['page_errors'])}.",
        f"Controller CPU per live update per console: {doc['update_cpu_ms_per_console']:g} ms (target ≤ "
        f"{t['update_cpu_ms_per_console']:g} ms); the notice made once, with one page open: {doc['update_cpu_ms_page']:g} ms; "
        f"the page's reads through the API per update: {doc['page_api_calls_per_update']:g}.",
        f"At rest with {plan['streams']} consoles open: {doc['rest_cpu_pct']:g} % of a core (target ≤ {t['rest_cpu_pct']:g} %).",
        *([" ", "Busy machine: load average above 1 or other labs running; figures not for publishing."]
          if doc["busy_machine"] else []),
        ""])
