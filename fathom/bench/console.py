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
- `many_ms`: the topology page again once the admin has `many` networks and routers (default
  MANY_NETWORKS, MANY_ROUTERS, made through the API: networks without ports besides the model's,
  routers without interfaces): the page counts them by status and lists one page of each (checked:
  the counts shown and PAGE rows); `many_lag_ms` its event loop's lag as above, `many_read_bytes`
  the bytes of the networks' and routers' reads of one load (what the API sent for them). Target
  ≤ 2000 ms, as the topology's.
- `update_cpu_ms_per_console`: controller CPU per live update per connected console. ROUNDS rounds,
  each of two runs of UPDATES port renames (in alternating order): one with UPDATE_STREAMS change-
  notice streams held by plain HTTP clients, one without; the topology page and one probe stream
  are open in both (a page applies a notice without reading through the API:
  `page_api_calls_per_update` says so). Each rename waits until the probe, and in the run with
  streams every stream, has received its notice (checked: every stream counts every `change`
  event). Per round: (with - without) / renames / streams, for the controller's event-loop thread
  (its main thread, where a stream is woken and its bytes written; schedstat, ns: the renames'
  reconciler passes run on another thread and do not blur it) and for the whole process (/proc
  ticks); the figure is the main thread's, over the rounds (mean, min, max). Target ≤ 1 ms.
- `rest_cpu_pct`: controller CPU over REST_S seconds with STREAMS streams open (a topology page at
  rest holds its stream and nothing else: no polling), less REST_S seconds with none, in % of one
  core. Target ≤ 1 %.
"""
from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from fathom.bench.report import busy, dist, environment, machine_activity

TARGETS = {"first_page_ms": 1000.0, "topology_ms": 2000.0, "node_ms": 2000.0, "many_ms": 2000.0,
           "update_cpu_ms_per_console": 1.0, "rest_cpu_pct": 1.0}
SMALL = 3              # nodes of the lab-sized cloud (their ports: PORTS each, at most 4)
STREAMS = 10           # consoles open at rest
UPDATE_STREAMS = 200   # consoles added for the cost of a live update per console (at most 256 listen)
ROUNDS = 4             # with/without runs of the update measure
MANY_NETWORKS, MANY_ROUTERS = 2000, 1000    # the admin's networks and routers in `many_ms`
PAGE = 50              # networks (routers) the page lists at a time beyond 200 (topology.js)
# the bytes the page's reads of networks and routers brought, and what it shows of them
MANY_JS = """return {bytes: performance.getEntriesByType("resource")
    .filter(e => /\\/v1\\/(networks|routers)\\b/.test(e.name)).reduce((s, e) => s + e.encodedBodySize, 0),
  rows: ["networks", "routers"].map(id => document.querySelectorAll(`#${id} tbody tr`).length),
  bars: ["networks-bar", "routers-bar"].map(id => document.getElementById(id).textContent),
  forms: document.querySelectorAll(".pager + form:not([hidden])").length};"""
STREAM_SOURCES = 4     # loopback addresses the streams come from (the API serves 64 connections a source)
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


def run(run_dir: Path, nodes: int = 100, ports: int = 100, samples: int = 5, updates: int = 20,
        rest_s: float = 30.0, rounds: int = ROUNDS, many: tuple[int, int] = (MANY_NETWORKS, MANY_ROUTERS),
        progress=lambda msg: None) -> dict:
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
                                                  "update_streams": UPDATE_STREAMS, "update_rounds": rounds,
                                                  "many_networks": many[0], "many_routers": many[1],
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
            progress(f"the topology of {cloud.ports} ports, {samples} times")
            doc["topology_ms"] = _times([usable() for _ in range(samples)])
            doc["lag_ms"] = dist(browser.execute_async_script(LAG_JS, LAG_S))
            progress(f"a node opened: its {ports} ports listed, {samples} times")
            doc["node_ms"] = _times([usable(f"s{nodes // 2}") for _ in range(samples)])
            errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            doc["page_errors"] = errors[:10]

            progress(f"{many[0]} networks and {many[1]} routers")
            doc["many"] = cloud.many(*many)
            loads = []
            for _ in range(samples):
                loads.append(usable())
                shown = browser.execute_script(MANY_JS)
                counted = [bar.split(" ", 1)[0] for bar in shown["bars"]]
                if shown["rows"] != [PAGE, PAGE] or shown["forms"] != 2 or counted != [str(n) for n in many]:
                    raise RuntimeError(f"the topology at {many[0]} networks and {many[1]} routers shows {shown}")
            doc["many_ms"] = _times(loads)
            doc["many_read_bytes"] = shown["bytes"]
            doc["many_lag_ms"] = dist(browser.execute_async_script(LAG_JS, LAG_S))
            doc["page_errors"] += [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"][:10]

            progress(f"{rounds} x {updates} port renames with the topology open, with and without "
                     f"{UPDATE_STREAMS} more change-notice streams")
            usable()
            time.sleep(SETTLE_S)
            calls = browser.execute_script(API_CALLS_JS)
            doc.update(_update_cost(ctl, cloud, rounds, updates))
            doc["page_api_calls_per_update"] = (browser.execute_script(API_CALLS_JS) - calls) / (2 * rounds * updates)
            browser.get("about:blank")
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

    def many(self, networks: int, routers: int) -> dict:
        """Networks (without ports) and routers made up to `networks` and `routers`."""
        from fathom.bench.scale.common import create_parallel
        t0 = time.monotonic()
        create_parallel(self.ctl, [{"name": f"many{i}", "type": "vxlan"} for i in range(networks - len(self.networks))],
                        path="/networks")
        create_parallel(self.ctl, [{"name": f"r{i}"} for i in range(routers)], path="/routers")
        made = time.monotonic() - t0
        deadline = time.monotonic() + 60     # until a pass has them all (what the page's summary counts)
        while [sum(self.ctl.api.get("/topology")[f].values()) for f in ("networks", "routers")] != [networks, routers]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the topology's summary did not count {networks} networks within 60 s")
            time.sleep(0.5)
        return {"networks": networks, "routers": routers, "made_s": round(made, 1)}

    def rename(self) -> None:
        self.ctl.api.patch(f"/ports/{self.port_ids[0]}", json={"name": f"renamed-{time.monotonic_ns()}"})


def _update_cost(ctl, cloud: _Cloud, rounds: int, updates: int) -> dict:
    """The update measure (see the module's doc): per round, each run's controller CPU (its main
    thread's and the whole process's) and the figure per update per console."""
    from fathom.bench.procs import thread_cpu_ns
    runs: dict[str, list] = {"with": [], "without": []}
    with _Streams(ctl, 1) as probe:
        for r in range(rounds):
            for arm in ("without", "with") if r % 2 == 0 else ("with", "without"):
                streams = _Streams(ctl, UPDATE_STREAMS, first_source=2) if arm == "with" else None
                with streams or contextlib.nullcontext():
                    time.sleep(SETTLE_S)
                    told = streams.counts() if streams else []
                    base = probe.counts()[0]
                    main0, cpu0 = thread_cpu_ns(ctl.proc.pid), ctl.cpu()
                    for i in range(1, updates + 1):
                        cloud.rename()
                        if not probe.wait_for(base + i) or (streams and not streams.wait_for(min(told) + i)):
                            raise RuntimeError("a rename's change notice did not reach every stream within 30 s")
                    main, cpu = (thread_cpu_ns(ctl.proc.pid) - main0) / 1e9, ctl.cpu() - cpu0
                    if streams:    # every stream received every notice the probe did, no more, no fewer
                        got = {c - t for c, t in zip(streams.counts(), told)}
                        if got != {probe.counts()[0] - base}:
                            raise RuntimeError(f"the streams received {sorted(got)} notices, the probe "
                                               f"{probe.counts()[0] - base}")
                runs[arm].append({"main_thread_s": round(main, 6), "process_s": round(cpu, 3)})
    per = {k: [(w[k] - wo[k]) * 1000 / updates / UPDATE_STREAMS for w, wo in zip(runs["with"], runs["without"])]
           for k in ("main_thread_s", "process_s")}

    def spread(values):
        return {"mean": round(sum(values) / len(values), 4), "min": round(min(values), 4),
                "max": round(max(values), 4), "rounds": [round(v, 4) for v in values]}
    return {"update_cpu_ms_per_console": spread(per["main_thread_s"])["mean"],
            "update_cpu_per_console_ms": {"main_thread": spread(per["main_thread_s"]),
                                          "process": spread(per["process_s"])},
            "update_cpu_ms_per_rename_without_streams": {
                "main_thread": round(sum(x["main_thread_s"] for x in runs["without"]) * 1000 / rounds / updates, 3),
                "process": round(sum(x["process_s"] for x in runs["without"]) * 1000 / rounds / updates, 2)},
            "update_runs": runs}


def _cpu_over(ctl, seconds: float) -> float:
    cpu0 = ctl.cpu()
    time.sleep(seconds)
    return ctl.cpu() - cpu0


class _Streams:
    """`n` change-notice streams (GET /v1/events) held open by plain HTTP clients (sockets read by one
    thread), from the loopback addresses 127.0.0.<first_source>.. (STREAM_SOURCES of them), each
    counting the `change` events it receives."""

    def __init__(self, ctl, n: int, first_source: int = 1):
        self.ctl, self.n, self.first_source = ctl, n, first_source
        self.socks: list = []
        self._counts = [0] * n
        self._hello = [False] * n
        self._tails = [b""] * n
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self):
        import socket
        port = int(self.ctl.url.rsplit(":", 1)[1])
        head = (f"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Authorization: Bearer {self.ctl.token}\r\nAccept: text/event-stream\r\n\r\n").encode()
        for i in range(self.n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((f"127.0.0.{self.first_source + i % STREAM_SOURCES}", 0))
            s.connect(("127.0.0.1", port))
            s.sendall(head)
            self.socks.append(s)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        with self._changed:
            if not self._changed.wait_for(lambda: all(self._hello), timeout=30):
                self.__exit__()
                raise RuntimeError("a change-notice stream did not open within 30 s")
        return self

    def _read(self) -> None:
        import selectors
        sel = selectors.DefaultSelector()
        for i, s in enumerate(self.socks):
            sel.register(s, selectors.EVENT_READ, i)
        while not self._stop.is_set():
            for key, _ in sel.select(0.2):
                i = key.data
                data = key.fileobj.recv(1 << 16)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                seen = self._tails[i] + data
                with self._changed:
                    self._counts[i] += seen.count(b"event: change")
                    self._hello[i] = self._hello[i] or b"event: hello" in seen
                    self._changed.notify_all()
                self._tails[i] = seen[-12:]     # shorter than either name: nothing counted twice
        sel.close()

    def counts(self) -> list[int]:
        with self._changed:
            return list(self._counts)

    def wait_for(self, count: int, timeout: float = 30) -> bool:
        """Until every stream has received `count` change events in all."""
        with self._changed:
            return self._changed.wait_for(lambda: min(self._counts, default=count) >= count, timeout=timeout)

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for s in self.socks:
            s.close()


def markdown(doc: dict) -> str:
    plan, t, u = doc["plan"], doc["targets"], doc["update_cpu_per_console_ms"]

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
        row(f"topology with {doc['many']['networks']} networks and {doc['many']['routers']} routers "
            f"(counted, {PAGE} of each listed)", doc["many_ms"], t["many_ms"]),
        "",
        f"Event loop lag after drawing the {doc['model']['ports']} ports: p50 {doc['lag_ms']['p50']:.0f} ms, "
        f"max {doc['lag_ms']['max']:.0f} ms; page errors: {len(doc['page_errors'])}.",
        f"With {doc['many']['networks']} networks and {doc['many']['routers']} routers: lag p50 "
        f"{doc['many_lag_ms']['p50']:.0f} ms, max {doc['many_lag_ms']['max']:.0f} ms; the page's reads of them brought "
        f"{doc['many_read_bytes']:,} bytes.",
        f"Controller CPU per live update per console (its event-loop thread; {plan['update_rounds']} rounds of "
        f"{plan['updates']} renames with and without {plan['update_streams']} streams): "
        f"mean {u['main_thread']['mean']:g} ms, min {u['main_thread']['min']:g}, max {u['main_thread']['max']:g} "
        f"(target ≤ {t['update_cpu_ms_per_console']:g} ms); the whole process: mean {u['process']['mean']:g} ms, "
        f"min {u['process']['min']:g}, max {u['process']['max']:g}; the page's reads through the API per update: "
        f"{doc['page_api_calls_per_update']:g}.",
        f"At rest with {plan['streams']} consoles open: {doc['rest_cpu_pct']:g} % of a core (target ≤ {t['rest_cpu_pct']:g} %).",
        *([" ", "Busy machine: load average above 1 or other labs running; figures not for publishing."]
          if doc["busy_machine"] else []),
        ""])
