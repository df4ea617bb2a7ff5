"""`fathom bench …`: measurement runs. One command per benchmark; each benchmark's logic lives in
`fathom/bench/<name>.py` and its command is added here (tenant, vtap, pptmon, l3 ... later)."""
from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import time
from pathlib import Path

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fathom.cli.output import console, fail, print_json, print_table


@click.group()
def bench():
    """Benchmarks: figures with their environment, as JSON, CSV, Markdown and PNG."""
    # `kill` (SIGTERM) ends a benchmark as Ctrl-C does: its cleanup runs (the controllers,
    # switches, labs and namespaces it started are stopped and removed)
    signal.signal(signal.SIGTERM, _terminated)


def _terminated(_signum, _frame):
    raise KeyboardInterrupt("terminated (SIGTERM)")


def _sizes(value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: a comma-separated list of frame sizes in bytes")


def output_dir(name: str, outdir: str | None) -> Path:
    """The run's output directory (made): `outdir`, or results/bench-<name>-<timestamp>/."""
    out = Path(outdir or f"results/bench-{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    return out


@contextlib.contextmanager
def progress_bar():
    """A transient progress bar; yields the `progress(msg, frac=None)` callback the benches take."""
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("starting", total=1.0)
        yield lambda msg, frac=None: bar.update(task, description=msg, **({} if frac is None else {"completed": frac}))


def stderr_progress():
    """A `progress(msg)` callback printing elapsed seconds and the message on stderr."""
    t0 = time.monotonic()
    return lambda msg: click.echo(f"[{time.monotonic() - t0:6.0f} s] {msg}", err=True)


def publish(name: str, doc: dict, out: Path, module, as_json: bool, plot: str | None = None) -> None:
    """Record the command line in `doc`, write results.json and summary.md (`module.markdown`) and the
    plot (`module.plot`, if named) under `out`, and print the summary, or the document with --json."""
    doc["command"] = f"fathom bench {name} " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    (out / "results.json").write_text(json.dumps(doc, indent=2, default=str))
    (out / "summary.md").write_text(module.markdown(doc))
    if plot:
        module.plot(doc, out / plot)
    if as_json:
        return print_json(doc)
    console.print(module.markdown(doc), highlight=False, markup=False)
    console.print(f"report: {out}/summary.md, raw: {out}/results.json" + (f", plot: {out}/{plot}" if plot else ""))


@bench.command("switch")
@click.option("--device", "devices", multiple=True, default=("ovs", "linuxbridge"), show_default=True,
              help="device under test: ovs (netdev bridge), linuxbridge, redirect (tc mirred, no switching), "
                   "veth; repeat for several")
@click.option("--module", "modules", multiple=True,
              help="module to run (repeatable; default all): calibration, generator, action-delay, frame-size, "
                   "load, throughput, flow-install, packet-in, echo, overlay")
@click.option("--quick", is_flag=True, help="short runs, labelled QUICK (RFC 2544 trials of 0.5 s / 2 s, not 60 s)")
@click.option("--sizes", help="frame sizes in bytes (incl. FCS), comma-separated; default 64..1518 (+jumbo)")
@click.option("--mtu", type=int, default=1500, show_default=True, help="MTU of every veth (9000 for jumbo frames)")
@click.option("--load-mbps", type=float, default=10.0, show_default=True, help="fixed load of the frame-size sweep")
@click.option("--loads", help="offered loads of the load sweep in Mb/s, comma-separated")
@click.option("--frames", type=int, help="frames per action in action-delay (default 30000)")
@click.option("--flows", type=int, help="flows in flow-install (default 20 quick / 100 full)")
@click.option("--loss-tolerance", type=float, default=0.0, show_default=True, help="RFC 2544 loss ratio accepted")
@click.option("--trial-s", type=float, help="RFC 2544 search trial length (default 0.5 quick / 5 full)")
@click.option("--final-trial-s", type=float,
              help="RFC 2544 confirming trial length (default 2 quick / 60 full, RFC 2544's; 0: none)")
@click.option("--final-trials", type=int, default=1, show_default=True, help="confirming trials that must all pass")
@click.option("--max-trials", type=int, help="RFC 2544 search trials at most (default 8 quick / 12 full)")
@click.option("--tput-repeats", type=int, default=1, show_default=True,
              help="independent RFC 2544 determinations per frame size (median, min, max reported)")
@click.option("--gen-repeats", type=int, help="generator module: turns of each tool (default 3 quick / 5 full)")
@click.option("--drop-every", type=int, default=0, help="self-test: the device drops every Nth frame (nftables)")
@click.option("--inject-reorder", type=int, default=0, help="self-test: swap every Nth pair of frames at the source")
@click.option("--inject-dup", type=int, default=0, help="self-test: send every Nth frame twice")
@click.option("--spin-us", type=int, default=20, show_default=True,
              help="generator busy-polls waits shorter than this (µs); 0 sleeps, leaving the CPU to the device")
@click.option("--per-frame", is_flag=True, help="keep a per-frame CSV of every latency run (OUTPUT/frames/)")
@click.option("--prefix", default="sb", show_default=True,
              help="names of this run's namespaces (<prefix>-gen, -dut, -rcv) and overlay lab (<prefix>ov)")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-switch-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def switch(devices, modules, quick, sizes, mtu, load_mbps, loads, frames, flows, loss_tolerance, trial_s,
           final_trial_s, final_trials, max_trials, tput_repeats, gen_repeats, drop_every, inject_reorder,
           inject_dup, spin_us, per_frame, prefix, outdir, as_json):
    """Oflops-style switch benchmark: calibration, the generator against trafgen, action delay, frame-size
    and load sweeps, RFC 2544 throughput, flow-install delay, packet_in, echo, and the VXLAN overlay."""
    import dataclasses
    import os

    from fathom.bench import report
    from fathom.bench.devices import Names, cleanup
    from fathom.bench.engine import BenchError
    from fathom.bench.overlay import lab_name
    from fathom.bench.switch import MODULES, Plan, SwitchBench
    from fathom.lab.sh import LabError, require_root_and_tools

    try:
        names = Names(prefix)
        require_root_and_tools(("ovs-vswitchd", "ovsdb-server", "ovs-vsctl", "ip", "ethtool", "nft", "tc",
                                "tcpdump"))
        plan = Plan.make(quick, mtu, _sizes(sizes))
        plan.fixed_load_mbps = load_mbps
        if loads:
            plan.loads_mbps = [float(x) for x in loads.split(",")]
        if frames:
            plan.action_frames = frames
        if flows:
            plan.flows = flows
        changes = {"loss_tolerance": loss_tolerance, "final_trials": final_trials}
        for key, value in (("trial_s", trial_s), ("final_s", final_trial_s), ("max_trials", max_trials)):
            if value is not None:
                changes[key] = value
        plan.search = dataclasses.replace(plan.search, **changes)
        plan.tput_repeats = tput_repeats
        if gen_repeats:
            plan.gen_repeats = gen_repeats
        plan.spin_us = spin_us
        plan.drop_every, plan.reorder_every, plan.dup_every = drop_every, inject_reorder, inject_dup
        if drop_every == 1 or drop_every < 0:
            raise BenchError("--drop-every must be >= 2")
        mods = list(modules) or list(MODULES)
        if drop_every or inject_reorder or inject_dup:
            mods = [m for m in mods if m not in ("calibration", "generator")] if modules else ["frame-size"]
        b = SwitchBench(plan, list(devices), mods, mtu=mtu, names=names)
    except (BenchError, LabError, click.BadParameter, ValueError) as e:
        fail(str(e), code=2)

    out = Path(outdir or f"results/bench-switch-{time.strftime('%Y%m%d-%H%M%S')}")
    if per_frame:
        b.keep_frames = str(out / "frames")
    own = ("/run/fathom-bench/", f"/{lab_name(names)}/")
    t0 = time.time()
    env = report.environment()
    env["machine_at_start"] = report.machine_activity(own)
    progress = Progress(TextColumn("{task.description:<48}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=console, transient=True, disable=as_json)
    try:
        with progress:
            task = progress.add_task("starting", total=b.planned_steps())

            def step(desc):
                progress.update(task, description=desc, advance=1)
            b.step = step
            results = b.run()
    except (BenchError, LabError) as e:
        cleanup(names)
        fail(str(e))
    except KeyboardInterrupt:
        cleanup(names)
        fail("interrupted; namespaces removed", code=130)
    env["loadavg_at_end"] = os.getloadavg()
    env["machine_at_end"] = report.machine_activity(own)
    env["contended"] = report.busy([env["machine_at_start"], env["machine_at_end"]])
    doc = {"command": "fathom bench switch " + " ".join(shlex.quote(a) for a in sys.argv[3:]) if len(sys.argv) > 2
           else "fathom bench switch", "plan": plan.to_dict(), "devices": list(devices), "modules": mods,
           "environment": env, "elapsed_s": time.time() - t0, "results": results, "extra": b.extra}
    report.write(out, doc)
    if as_json:
        print_json(doc)
        return
    rows = []
    for m, rs in results.items():
        for r in rs:
            if m in ("flow-install", "generator", "tx-stamp-check"):
                continue
            lat = r.get("latency_p50_ns", r.get("p50_ns"))
            rows.append([m, r.get("device", r.get("path", "")), r.get("action", r.get("frame_size_bytes", "")),
                         r.get("offered_mbps", r.get("throughput_mbps", "")),
                         "" if r.get("loss_ratio") is None else f"{100 * r['loss_ratio']:.3f}",
                         "" if lat is None else f"{lat / 1000:.2f}",
                         "" if r.get("latency_p99_ns", r.get("p99_ns")) is None else
                         f"{r.get('latency_p99_ns', r.get('p99_ns')) / 1000:.2f}",
                         "yes" if r.get("generator_limited") else ""])
    print_table("fathom bench switch", ["module", "device/path", "action/size", "Mb/s", "loss %", "p50 µs", "p99 µs",
                                        "gen-limited"], rows)
    console.print(f"report: {out}/summary.md ({time.time() - t0:.0f} s)")


@bench.command("tenant")
@click.option("--quick", is_flag=True, help="2 s runs, 1 repeat, 20 new ports, 1000 bulk ports")
@click.option("--seconds", type=int, default=5, show_default=True, help="length of each iperf3 run")
@click.option("--repeats", type=click.IntRange(1, 100), default=None,
              help="interleaved repeats of every steering path and off/on pairs of every PPTMon path "
                   "(default 3 and 10)")
@click.option("--udp-mbps", type=int, default=2000, show_default=True,
              help="UDP offered load (above what the path carries: the figure is what arrives)")
@click.option("--data-plane-only", is_flag=True, help="skip the control-plane measurements")
@click.option("--ports", type=int, default=100, show_default=True, help="new ports timed API → first packet (≤150)")
@click.option("--bulk-ports", type=int, default=10000, show_default=True, help="ports created for the flows/s figure (0: skip)")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-tenant-<timestamp>/")
@click.option("--json", "as_json", is_flag=True)
def tenant(quick, seconds, repeats, udp_mbps, data_plane_only, ports, bulk_ports, outdir, as_json):
    """Tenant networking: L2/L3 throughput and RTT as ratios, new-port latency, flow install rate."""
    from fathom.bench import tenant as tb
    from fathom.lab.sh import LabError
    if ports > 150:
        raise click.BadParameter("at most 150", param_hint="--ports")
    if quick:
        seconds, repeats, ports, bulk_ports = 2, 1, 20, min(bulk_ports, 1000)
    out = output_dir("tenant", outdir)
    with progress_bar() as progress:
        b = tb.TenantBench(seconds=seconds, repeats=repeats, udp_mbps=udp_mbps, ports=ports, bulk_ports=bulk_ports,
                           progress=progress)
        try:
            doc = b.run(control_plane=not data_plane_only)
        except (LabError, OSError) as e:
            fail(str(e))
    publish("tenant", doc, out, tb, as_json, plot="tenant.png")


@bench.command("vtap")
@click.option("--quick", is_flag=True, help="QUICK: sizes 64, 512, 1518, 1 s per run, 2 repeats")
@click.option("--seconds", type=float, default=2.0, show_default=True, help="seconds per run")
@click.option("--sizes", help="frame sizes in bytes incl. FCS, comma-separated (default 64,128,256,512,1024,1518)")
@click.option("--loads-pps", help="offered UDP loads in frames/s, comma-separated (default 10000,40000)")
@click.option("--proto", "protos", multiple=True, default=("udp", "tcp"), show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="interleaved repeats; medians and ranges")
@click.option("--lab", "lab_name", default="tvb", show_default=True, help="name of the lab the benchmark builds")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-vtap-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def vtap(quick, seconds, sizes, loads_pps, protos, repeats, lab_name, outdir, as_json):
    """vTAP (the vTAP paper Fig. 8): what the receiver and the monitor get per frame size with no tap, the fathom
    tap and OVS port mirroring on the same bridge, at equal offered loads, in one run."""
    import os

    from fathom.bench import report
    from fathom.bench import vtap as vb
    from fathom.bench.engine import BenchError
    from fathom.lab.sh import LabError
    size_list = _sizes(sizes) or ((64, 512, 1518) if quick else vb.SIZES)
    loads = tuple(float(x) for x in loads_pps.split(",")) if loads_pps else vb.LOADS_PPS
    if quick:
        seconds, repeats = 1.0, 2
    params = vb.Params(seconds=seconds, sizes=tuple(size_list), loads_pps=loads, repeats=repeats, protos=tuple(protos))
    out = Path(outdir or f"results/bench-vtap-{time.strftime('%Y%m%d-%H%M%S')}")
    b = vb.VtapBench(params, lab=lab_name, progress=lambda msg: None if as_json else console.print(msg, highlight=False, markup=False))
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env = report.environment()
    own = (f"/{lab_name}/",)
    env["machine_at_start"] = report.machine_activity(own)
    try:
        b.up()
        result = b.sweep()
    except (BenchError, LabError, OSError, RuntimeError) as e:
        fail(str(e))
    finally:
        b.down()
    env["loadavg_at_end"] = os.getloadavg()
    env["machine_at_end"] = report.machine_activity(own)
    env["contended"] = report.busy([env["machine_at_start"], env["machine_at_end"]])
    doc = {"started": started, "command": "fathom bench vtap " + " ".join(shlex.quote(a) for a in sys.argv[3:]),
           "quick": quick, "environment": env, "seconds": seconds, "repeats": repeats, "sizes": list(size_list),
           "loads_pps": list(loads), **result}
    files = vb.write(doc, out)
    if as_json:
        return print_json(doc)
    console.print(vb.markdown(doc), highlight=False, markup=False)
    console.print("files: " + ", ".join(files))


@bench.command("secgroups")
@click.option("--quick", is_flag=True, help="2 s runs, 2 repeats")
@click.option("--seconds", type=int, default=5, show_default=True, help="length of each iperf3 run and connection test")
@click.option("--repeats", type=int, default=3, show_default=True, help="interleaved repeats of the three modes")
@click.option("--clients", type=int, default=2, show_default=True, help="parallel connecting processes")
@click.option("--lab", "lab_name", default="sgb", show_default=True, help="name of the lab the benchmark builds")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False),
              help="default results/bench-secgroups-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def secgroups(quick, seconds, repeats, clients, lab_name, outdir, as_json):
    """Security groups: TCP throughput and new connections/s with no port security, a group of one
    ingress rule and a group of 100 rules, same node and across the tunnel, as ratios: conntrack's price
    (sg1 / none), the rules' (sg100 / sg1) and the whole (sg100 / none, target >= 0.9)."""
    import json as json_
    import os

    from fathom.bench import report
    from fathom.bench import secgroups as sb
    from fathom.lab.sh import LabError
    if quick:
        seconds, repeats = 2, 2
    out = Path(outdir or f"results/bench-secgroups-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env = report.environment()
    own = (f"/{lab_name}/",)
    env["machine_at_start"] = report.machine_activity(own)
    b = sb.SecgroupsBench(lab_name, seconds=seconds, repeats=repeats, clients=clients,
                          progress=lambda msg: None if as_json else console.print(msg, highlight=False, markup=False))
    try:
        doc = b.run()
    except (LabError, OSError, RuntimeError) as e:
        fail(str(e))
    env["loadavg_at_end"] = os.getloadavg()
    env["machine_at_end"] = report.machine_activity(own)
    env["contended"] = report.busy([env["machine_at_start"], env["machine_at_end"]])
    doc = {"started": started, "command": "fathom bench secgroups " + " ".join(shlex.quote(a) for a in sys.argv[3:]),
           "environment": env, **doc}
    (out / "secgroups.json").write_text(json_.dumps(doc, indent=2))
    (out / "secgroups.md").write_text(sb.markdown(doc))
    if as_json:
        return print_json(doc)
    console.print(sb.markdown(doc), highlight=False, markup=False)
    console.print(f"files: {out}/secgroups.json, {out}/secgroups.md")


@bench.command("sfc")
@click.option("--quick", is_flag=True, help="2 s runs, 1 repeat, 500 requests")
@click.option("--seconds", type=int, default=5, show_default=True, help="length of each iperf3 and timed ab run")
@click.option("--repeats", type=click.IntRange(1, 100), default=None,
              help="interleaved repeats of every steering path and off/on pairs of every PPTMon path "
                   "(default 3 and 10)")
@click.option("--requests", type=int, default=2000, show_default=True, help="ab requests through the web chain")
@click.option("--part", "parts", multiple=True, type=click.Choice(["steering", "web", "pptmon"]),
              help="run only these parts (repeatable; default all)")
@click.option("--lab", "lab_name", default="sfb", show_default=True, help="name of the lab built for the run")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-sfc-<timestamp>/")
@click.option("--json", "as_json", is_flag=True)
def sfc(quick, seconds, repeats, requests, parts, lab_name, outdir, as_json):
    """Service chains: steering through 1-3 VNFs against the same VNFs by plain routing; ab through
    fw → dpi → nginx; PPTMon off and at 1 sample/s per VNF type and on two real chains."""
    from fathom.bench import sfc as sb
    from fathom.lab.sh import LabError
    if quick:
        seconds, repeats, requests = 2, 1, 500
    out = output_dir("sfc", outdir)
    b = sb.SfcBench(lab_name=lab_name, seconds=seconds, repeats=repeats, requests=requests,
                    parts=parts or sb.PARTS, progress=stderr_progress())
    try:
        doc = b.run()
    except (LabError, OSError, RuntimeError) as e:
        fail(str(e))
    publish("sfc", doc, out, sb, as_json)


@bench.command("sfc-accuracy")
@click.option("--packets", type=int, default=1500, show_default=True, help="datagrams sent through the chain")
@click.option("--rate", type=float, default=500.0, show_default=True, help="datagrams per second (paced)")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False),
              help="default results/bench-sfc-accuracy-<timestamp>/")
def sfc_accuracy(packets, rate, outdir):
    """PPTMon's per-VNF time on a port chain against a capture at the same host interfaces, packet by
    packet (lab znacc, one hybrid-plugged firewall); the results in OUTPUT/results.json."""
    import tempfile
    from fathom.bench import sfc_accuracy as sa
    out = output_dir("sfc-accuracy", outdir)
    with tempfile.TemporaryDirectory(prefix="znacc-") as work:
        doc = {"command": f"fathom bench sfc-accuracy --packets {packets} --rate {rate:g} -o {out}",
               "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               **sa.measure(packets, rate, Path(work))}
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    click.echo(json.dumps({k: doc[k] for k in ("matched", "difference_us", "in_side_us", "out_side_us")}, indent=1))


@bench.command("restart")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True, help="controller restarts")
@click.option("--downtime", type=click.FloatRange(0.0, 120.0), default=10.0, show_default=True,
              help="seconds the controller is down each time (OVS's default backoff reaches 8 s after ~7 s)")
@click.option("--lab", "lab_name", default="brs", show_default=True, help="name of the lab it builds")
@click.option("--quick", is_flag=True, help="2 rounds")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-restart-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def restart(rounds, downtime, lab_name, quick, outdir, as_json):
    """A controller restart: seconds from the restarted controller answering its API to every switch
    back, to a port plugged meanwhile and a port created at once after it turning active, and whether
    any other port's status left active meanwhile. Progress goes to stderr."""
    from fathom.bench import restart as rb
    from fathom.lab.sh import LabError
    if quick:
        rounds = min(rounds, 2)
    out = output_dir("restart", outdir)
    try:
        doc = rb.Bench(lab_name, rounds, downtime, stderr_progress()).run()
    except (LabError, OSError) as e:
        fail(str(e))
    publish("restart", doc, out, rb, as_json)


@bench.command("all")
@click.option("--quick", is_flag=True, help="short runs")
@click.pass_context
def all_benches(ctx, quick):
    """Run every benchmark of this group in turn (`make bench`), each with its default options."""
    for name, cmd in sorted(bench.commands.items()):
        if cmd is ctx.command:
            continue
        console.print(f"[bold]fathom bench {name}[/bold]")
        params = {p.name for p in cmd.params}
        ctx.invoke(cmd, **({"quick": quick} if "quick" in params else {}))


@bench.command("scale")
@click.option("--sizes", default="10x1,100x10,100x100", show_default=True,
              help="simulated fabrics, NODESxPORTS_PER_NODE, comma-separated")
@click.option("--samples", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="new ports timed one by one (API call → active) per fabric")
@click.option("--api-ports", type=click.IntRange(8, 100000), default=2000, show_default=True,
              help="ports created per API-rate run")
@click.option("--writers", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--store", "stores", multiple=True, type=click.Choice(["sqlite", "postgresql"]),
              default=("sqlite", "postgresql"), show_default=True, help="stores of the API-rate runs")
@click.option("--resync-ports", type=click.IntRange(0, 100000), default=10000, show_default=True,
              help="ports (one flow each on the wiped bridge) of the real-OVS resync; 0 skips it")
@click.option("--api-workers", default="1", show_default=True,
              help="API processes of the controller in the PostgreSQL API-rate runs, comma-separated (e.g. 1,2,4)")
@click.option("--part", "parts", multiple=True, type=click.Choice(["api", "fabric", "resync", "cluster"]),
              help="run only these parts (repeatable; default all)")
@click.option("--replicas", type=click.IntRange(2, 8), default=3, show_default=True,
              help="controller replicas of the cluster part")
@click.option("--cluster-switches", type=click.IntRange(2, 250), default=100, show_default=True,
              help="simulated switches of the cluster part")
@click.option("--idle", "idle_s", type=click.FloatRange(1, 600), default=60, show_default=True,
              help="seconds at rest over which the cluster part measures CPU")
@click.option("--lab", "lab_name", default="bsc", show_default=True, help="name of the lab the resync part builds")
@click.option("--quick", is_flag=True, help="fabrics 10x1,20x5, 400 API ports, 1000 resync ports, 20 switches "
                                            "and 10 s at rest for the cluster")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-scale-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def scale(sizes, samples, api_ports, writers, stores, api_workers, resync_ports, parts, replicas, cluster_switches,
          idle_s, lab_name, quick, outdir, as_json):
    """The controller at scale: API create rate (SQLite, PostgreSQL), port-up latency, CPU per change
    and full resync on simulated fabrics (OpenFlow switches in a process of their own), the full
    resync of a real OVS bridge, and controller replicas' lease shares and CPU at rest. Progress goes
    to stderr."""
    from fathom.bench import scale as sc
    from fathom.bench.scale.common import hold_run_dir
    if quick:
        sizes, api_ports, resync_ports, samples = "10x1,20x5", min(api_ports, 400), min(resync_ports, 1000), min(samples, 10)
        cluster_switches, idle_s = min(cluster_switches, 20), min(idle_s, 10)
    try:
        workers = tuple(int(w) for w in api_workers.split(","))
        if not all(1 <= w <= 64 for w in workers):
            raise ValueError
    except ValueError:
        raise click.BadParameter("API process counts from 1 to 64, comma-separated", param_hint="--api-workers")
    try:
        plan = sc.Plan(sc.parse_sizes(sizes), samples, api_ports, writers, tuple(stores), workers, resync_ports,
                       lab_name, tuple(parts) or ("api", "fabric", "resync", "cluster"), replicas, cluster_switches,
                       idle_s)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--sizes")
    out = output_dir("scale", outdir)
    try:
        run_dir = sc.RUN_ROOT / f"scale-{lab_name}"
        with hold_run_dir(run_dir):
            doc = sc.run(plan, run_dir, stderr_progress())
    except (RuntimeError, OSError) as e:
        fail(str(e))
    publish("scale", doc, out, sc, as_json, plot="scale.png")


@bench.command("console")
@click.option("--nodes", type=click.IntRange(1, 250), default=100, show_default=True)
@click.option("--ports", type=click.IntRange(1, 1000), default=100, show_default=True, help="ports per node")
@click.option("--samples", type=click.IntRange(1, 100), default=5, show_default=True, help="page loads timed per size")
@click.option("--updates", type=click.IntRange(1, 1000), default=20, show_default=True, help="live updates timed per run")
@click.option("--rest", "rest_s", type=click.FloatRange(1, 3600), default=30.0, show_default=True,
              help="seconds at rest measured (with and without consoles)")
@click.option("--rounds", type=click.IntRange(1, 100), default=4, show_default=True,
              help="rounds of updates timed with and without 200 more consoles")
@click.option("--quick", is_flag=True, help="10 nodes x 10 ports, 250 networks and routers, 3 samples, 2 rounds of "
                                           "5 updates, 10 s at rest")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-console-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def console_bench(nodes, ports, samples, updates, rest_s, rounds, quick, outdir, as_json):
    """The web console in headless Chromium against a controller of its own holding bench scale's
    model of NODES x PORTS: first page and topology time to usable (also with 2,000 networks and
    1,000 routers), the page's responsiveness,
    controller CPU per live update per console and at rest with 10 consoles open."""
    from fathom.bench import console as cb
    from fathom.bench.scale.common import RUN_ROOT, hold_run_dir
    if quick:
        nodes, ports, samples, updates, rest_s, rounds = 10, 10, 3, 5, 10.0, 2
    many = (250, 250) if quick else (cb.MANY_NETWORKS, cb.MANY_ROUTERS)
    out = output_dir("console", outdir)
    try:
        with hold_run_dir(RUN_ROOT / "console"):
            doc = cb.run(RUN_ROOT / "console", nodes, ports, samples, updates, rest_s, rounds, many, stderr_progress())
    except (RuntimeError, OSError) as e:
        fail(str(e))
    publish("console", doc, out, cb, as_json)


@bench.command("trace")
@click.option("--nodes", type=click.IntRange(1, 250), default=100, show_default=True)
@click.option("--ports", type=click.IntRange(1, 1000), default=100, show_default=True, help="ports per node")
@click.option("--samples", type=click.IntRange(1, 100000), default=200, show_default=True, help="traces timed")
@click.option("--seed", type=int, default=1, show_default=True, help="of the random draw of port pairs")
@click.option("--quick", is_flag=True, help="10 nodes x 10 ports, 50 traces (with --live: 5 traces, 2 pairs of 3 s; "
                                           "5 s runs at the fixed rate)")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-trace-<timestamp>/")
@click.option("--live", "live", type=click.IntRange(1, 1000), default=None,
              help="instead: N live traces on the default lab (needs root): answer time, per-hop times vs tcpdump")
@click.option("--iperf", "with_iperf", is_flag=True,
              help="with --live: also iperf3 vm1 -> vm3 with and without live traces, interleaved pairs")
@click.option("--pairs", type=click.IntRange(2, 50), default=5, show_default=True,
              help="with --iperf: on/off pairs at least (more until N traces ran during the on runs)")
@click.option("--iperf-seconds", type=click.IntRange(1, 600), default=10, show_default=True,
              help="with --iperf: seconds of each iperf3 run")
@click.option("--rate", "rate_mbps", type=click.FloatRange(1, 10_000), default=40, show_default=True,
              help="with --iperf: the fixed rate (Mb/s) of the runs that measure ovs-vswitchd's CPU per GB")
@click.option("--cost-pairs", type=click.IntRange(2, 50), default=6, show_default=True,
              help="with --iperf: on/off pairs at the fixed rate")
@click.option("--cost-seconds", type=click.IntRange(1, 600), default=10, show_default=True,
              help="with --iperf: seconds of each run at the fixed rate")
@click.option("--lab", "lab_name", default="tftl", show_default=True, help="with --live: name of the lab it builds")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def trace_bench(nodes, ports, samples, seed, quick, outdir, live, with_iperf, pairs, iperf_seconds, rate_mbps,
                cost_pairs, cost_seconds, lab_name, as_json):
    """Simulated trace latency (p50/p99, wall clock and CPU) on bench scale's model of NODES x PORTS:
    a random port to a random other port of its network, as POST /v1/traces runs it. With --live N:
    the live trace on a lab instead."""
    from fathom.bench import trace as tr
    if live is not None:
        from fathom.bench import trace_live
        out = output_dir("trace", outdir)
        if quick:
            live, pairs, iperf_seconds, cost_seconds = 5, 2, 3, 5
        doc = trace_live.run(live, lab_name, progress=stderr_progress(), with_iperf=with_iperf, pairs=pairs,
                             seconds=iperf_seconds, rate_mbps=rate_mbps, cost_pairs=cost_pairs,
                             cost_seconds=cost_seconds)
        return publish("trace", doc, out, trace_live, as_json)
    if quick:
        nodes, ports, samples = 10, 10, 50
    out = output_dir("trace", outdir)
    doc = tr.run(nodes, ports, samples, seed, stderr_progress())
    publish("trace", doc, out, tr, as_json)


@bench.command("ha")
@click.option("--repeat", type=click.IntRange(1, 100), default=10, show_default=True, help="times each event is done")
@click.option("--events", default=",".join(("kill", "pause", "rolling", "postgres")), show_default=True,
              help="events, comma-separated: kill, pause, rolling, postgres")
@click.option("--pause", type=click.FloatRange(0.5, 600.0), default=30.0, show_default=True,
              help="seconds a paused master stays stopped (SIGSTOP)")
@click.option("--pg-down", type=click.FloatRange(0.5, 600.0), default=10.0, show_default=True,
              help="seconds PostgreSQL stays stopped")
@click.option("--writers", type=click.IntRange(0, 64), default=8, show_default=True, help="API writers throughout")
@click.option("--replicas", type=click.IntRange(2, 9), default=3, show_default=True)
@click.option("--lab", "lab_name", default="bha", show_default=True, help="name of the lab it builds")
@click.option("--quick", is_flag=True, help="once each, a 5 s pause, PostgreSQL down 3 s, 2 writers")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-ha-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def ha_bench(repeat, events, pause, pg_down, writers, replicas, lab_name, quick, outdir, as_json):
    """Controller replicas failing under load: a lab under a cluster of replicas on a PostgreSQL the
    bench starts, pings every 20 ms and API writers throughout, while it kills, pauses and restarts
    masters and stops PostgreSQL. Per event: lease moved, first change applied by the new master,
    echoes lost, 5xx answers; kill -> applied p50/p99 against 1.5 s / 3 s. Progress goes to stderr."""
    from fathom.bench import ha
    from fathom.lab.sh import LabError
    chosen = tuple(e.strip() for e in events.split(",") if e.strip())
    if unknown := set(chosen) - set(ha.EVENTS):
        raise click.BadParameter(f"unknown events {sorted(unknown)}: choose from {', '.join(ha.EVENTS)}")
    if quick:
        repeat, pause, pg_down, writers = 1, 5.0, 3.0, 2
    out = output_dir("ha", outdir)
    try:
        doc = ha.run(repeat, chosen, pause, pg_down, writers, lab_name, replicas, stderr_progress(), out / "logs")
    except (LabError, OSError, TimeoutError) as e:
        fail(str(e))
    publish("ha", doc, out, ha, as_json, plot="timeline.svg")


@bench.command("flow-records")
@click.option("--quick", is_flag=True, help="QUICK: 2 s runs, 2 repeats, 2 CPU trials, a flood limit of 2000, "
                                           "5 s runs at the fixed rate")
@click.option("--seconds", type=int, default=10, show_default=True, help="length of each iperf3 run")
@click.option("--repeats", type=click.IntRange(1, 100), default=5, show_default=True,
              help="interleaved repeats of the three sampling modes")
@click.option("--cpu-trials", type=click.IntRange(1, 100), default=5, show_default=True,
              help="trials of 10,000 records ingested")
@click.option("--flood-limit", type=click.IntRange(100, 1_000_000), default=20_000, show_default=True,
              help="the flows an agent and a controller hold at most, in the flood")
@click.option("--rate", "rate_mbps", type=click.FloatRange(1, 10_000), default=40, show_default=True,
              help="the fixed rate (Mb/s) of the runs that measure ovs-vswitchd's CPU per GB in each mode")
@click.option("--cost-repeats", type=click.IntRange(2, 100), default=6, show_default=True,
              help="interleaved repeats of the three modes at the fixed rate")
@click.option("--cost-seconds", type=click.IntRange(1, 600), default=10, show_default=True,
              help="seconds of each run at the fixed rate")
@click.option("--cpu-only", is_flag=True, help="only the controller's CPU per 10,000 records")
@click.option("--lab", "lab_name", default="frb", show_default=True, help="name of the lab the benchmark builds")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False),
              help="default results/bench-flow-records-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def flow_records_bench(quick, seconds, repeats, cpu_trials, flood_limit, rate_mbps, cost_repeats, cost_seconds,
                       cpu_only, lab_name, outdir, as_json):
    """Flow records: TCP throughput with sampling 1:100 on every port and 1:1 on drops only against
    off (interleaved; ratios, targets 0.97 and 0.99), ovs-vswitchd's CPU per GB at a fixed rate in
    the same modes (what predicts those ratios where the datapath is CPU-bound), records' delay to
    the API (≤ 2 s), controller CPU per 10,000 records (≤ 50 ms), memory under a flood of new
    5-tuples (bounded, evictions counted)."""
    from fathom.bench import flow_records as fb
    from fathom.lab.sh import LabError
    if quick:
        seconds, repeats, cpu_trials, flood_limit, cost_seconds = 2, 2, 2, 2000, 5
    out = output_dir("flow-records", outdir)
    b = fb.FlowRecordsBench(lab_name, seconds=seconds, repeats=repeats, cpu_trials=cpu_trials,
                            flood_limit=flood_limit, rate_mbps=rate_mbps, cost_repeats=cost_repeats,
                            cost_seconds=cost_seconds, progress=stderr_progress())
    try:
        doc = b.run(cpu_only=cpu_only)
    except (LabError, OSError, RuntimeError) as e:
        fail(str(e))
    doc["quick"] = quick
    publish("flow-records", doc, out, fb, as_json)
