"""`fathom bench …`: measurement runs. One command per benchmark; each benchmark's logic lives in
`fathom/bench/<name>.py` and its command is added here (tenant, vtap, pptmon, l3 ... later)."""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fathom.cli.output import console, fail, print_json, print_table


@click.group()
def bench():
    """Benchmarks: figures with their environment, as JSON, CSV, Markdown and PNG."""


def _sizes(value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: a comma-separated list of frame sizes in bytes")


@bench.command("switch")
@click.option("--device", "devices", multiple=True, default=("ovs", "linuxbridge"), show_default=True,
              help="device under test: ovs (netdev bridge), linuxbridge, veth; repeat for several")
@click.option("--module", "modules", multiple=True,
              help="module to run (repeatable; default all): calibration, action-delay, frame-size, load, "
                   "throughput, flow-install, packet-in, echo, overlay")
@click.option("--quick", is_flag=True, help="short runs: finishes in a couple of minutes")
@click.option("--sizes", help="frame sizes in bytes (incl. FCS), comma-separated; default 64..1518 (+jumbo)")
@click.option("--mtu", type=int, default=1500, show_default=True, help="MTU of every veth (9000 for jumbo frames)")
@click.option("--load-mbps", type=float, default=10.0, show_default=True, help="fixed load of the frame-size sweep")
@click.option("--loads", help="offered loads of the load sweep in Mb/s, comma-separated")
@click.option("--frames", type=int, help="frames per action in action-delay (default 30000)")
@click.option("--flows", type=int, help="flows in flow-install (default 50 quick / 200 full)")
@click.option("--loss-tolerance", type=float, default=0.0, show_default=True, help="RFC 2544 loss ratio accepted")
@click.option("--drop-every", type=int, default=0, help="self-test: the device drops every Nth frame (nftables)")
@click.option("--inject-reorder", type=int, default=0, help="self-test: swap every Nth pair of frames at the source")
@click.option("--inject-dup", type=int, default=0, help="self-test: send every Nth frame twice")
@click.option("--spin-us", type=int, default=20, show_default=True,
              help="generator busy-polls waits shorter than this (µs); 0 sleeps, leaving the CPU to the device")
@click.option("--per-frame", is_flag=True, help="keep a per-frame CSV of every latency run (OUTPUT/frames/)")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-switch-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def switch(devices, modules, quick, sizes, mtu, load_mbps, loads, frames, flows, loss_tolerance, drop_every,
           inject_reorder, inject_dup, spin_us, per_frame, outdir, as_json):
    """Oflops-style switch benchmark: calibration, action delay, frame-size and load sweeps, RFC 2544
    throughput, flow-install delay, packet_in, echo, and the VXLAN overlay comparison."""
    from fathom.bench import report
    from fathom.bench.devices import cleanup
    from fathom.bench.engine import BenchError
    from fathom.bench.switch import MODULES, Plan, SwitchBench
    from fathom.lab.sh import LabError, require_root_and_tools

    try:
        require_root_and_tools(("ovs-vswitchd", "ovsdb-server", "ovs-vsctl", "ip", "ethtool", "nft"))
        plan = Plan.make(quick, mtu, _sizes(sizes))
        plan.fixed_load_mbps = load_mbps
        if loads:
            plan.loads_mbps = [float(x) for x in loads.split(",")]
        if frames:
            plan.action_frames = frames
        if flows:
            plan.flows = flows
        plan.loss_tolerance = loss_tolerance
        plan.spin_us = spin_us
        plan.drop_every, plan.reorder_every, plan.dup_every = drop_every, inject_reorder, inject_dup
        if drop_every == 1 or drop_every < 0:
            raise BenchError("--drop-every must be >= 2")
        mods = list(modules) or list(MODULES)
        if drop_every or inject_reorder or inject_dup:
            mods = [m for m in mods if m != "calibration"] if modules else ["frame-size"]
        b = SwitchBench(plan, list(devices), mods, mtu=mtu)
    except (BenchError, LabError, click.BadParameter, ValueError) as e:
        fail(str(e), code=2)

    out = Path(outdir or f"results/bench-switch-{time.strftime('%Y%m%d-%H%M%S')}")
    if per_frame:
        b.keep_frames = str(out / "frames")
    t0 = time.time()
    env = report.environment()
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
        cleanup()
        fail(str(e))
    except KeyboardInterrupt:
        cleanup()
        fail("interrupted; namespaces removed", code=130)
    import os
    env["loadavg_at_end"] = os.getloadavg()
    env["contended"] = bool(env["foreign_ovs_vswitchd_at_start"] or max(env["loadavg_at_start"][0], env["loadavg_at_end"][0]) > 1.0)
    doc = {"command": "fathom bench switch " + " ".join(shlex.quote(a) for a in sys.argv[3:]) if len(sys.argv) > 2
           else "fathom bench switch", "plan": plan.__dict__, "devices": list(devices), "modules": mods,
           "environment": env, "elapsed_s": time.time() - t0, "results": results, "extra": b.extra}
    report.write(out, doc)
    if as_json:
        print_json(doc)
        return
    rows = []
    for m, rs in results.items():
        for r in rs:
            if m in ("flow-install",):
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
@click.option("--repeats", type=int, default=3, show_default=True, help="interleaved repeats of every path")
@click.option("--udp-mbps", type=int, default=2000, show_default=True,
              help="UDP offered load (above what the path carries: the figure is what arrives)")
@click.option("--data-plane-only", is_flag=True, help="skip the control-plane measurements")
@click.option("--ports", type=int, default=100, show_default=True, help="new ports timed API → first packet (≤150)")
@click.option("--bulk-ports", type=int, default=10000, show_default=True, help="ports created for the flows/s figure (0: skip)")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-tenant-<timestamp>/")
@click.option("--json", "as_json", is_flag=True)
def tenant(quick, seconds, repeats, udp_mbps, data_plane_only, ports, bulk_ports, outdir, as_json):
    """Tenant networking: L2/L3 throughput and RTT as ratios, new-port latency, flow install rate."""
    import json as json_

    from fathom.bench import tenant as tb
    from fathom.lab.sh import LabError
    if ports > 150:
        raise click.BadParameter("at most 150", param_hint="--ports")
    if quick:
        seconds, repeats, ports, bulk_ports = 2, 1, 20, min(bulk_ports, 1000)
    out = Path(outdir or f"results/bench-tenant-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("starting", total=1.0)
        b = tb.TenantBench(seconds=seconds, repeats=repeats, udp_mbps=udp_mbps, ports=ports, bulk_ports=bulk_ports,
                           progress=lambda msg, frac=None: progress.update(task, description=msg,
                                                                            **({} if frac is None else {"completed": frac})))
        try:
            doc = b.run(control_plane=not data_plane_only)
        except (LabError, OSError) as e:
            fail(str(e))
    doc["command"] = "fathom bench tenant " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    (out / "results.json").write_text(json_.dumps(doc, indent=2))
    (out / "summary.md").write_text(tb.markdown(doc))
    tb.plot(doc, out / "tenant.png")
    if as_json:
        return print_json(doc)
    console.print(tb.markdown(doc), highlight=False)
    console.print(f"report: {out}/summary.md, plot {out}/tenant.png")


@bench.command("vtap")
@click.option("--quick", is_flag=True, help="sizes 64, 512, 1500 and 1 s per point")
@click.option("--seconds", type=float, default=2.0, show_default=True, help="seconds per point")
@click.option("--sizes", help="frame sizes in bytes, comma-separated (default 64,128,256,512,1024,1500)")
@click.option("--udp-mbps", type=float, default=200.0, show_default=True, help="UDP offered load")
@click.option("--below-mbps", type=float, default=20.0, show_default=True,
              help="UDP load of the copies-delivered run (below saturation)")
@click.option("--proto", "protos", multiple=True, default=("udp", "tcp"), show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="interleaved repeats; medians reported")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-vtap-<timestamp>/")
@click.option("--json", "as_json", is_flag=True, help="print the results document as JSON")
def vtap(quick, seconds, sizes, udp_mbps, below_mbps, protos, repeats, outdir, as_json):
    """vTAP (the vTAP paper's Fig. 8 setting): receiver and monitor RX throughput per frame size with no tap, the fathom
    tap and OVS port mirroring on the same bridge, in one run; share of copies delivered."""
    from fathom.bench import report
    from fathom.bench import vtap as vb
    from fathom.lab.sh import LabError
    size_list = _sizes(sizes) or ((64, 512, 1500) if quick else vb.SIZES)
    if quick:
        seconds, repeats = 1.0, 1
    out = Path(outdir or f"results/bench-vtap-{time.strftime('%Y%m%d-%H%M%S')}")
    b = vb.VtapBench(seconds=seconds, udp_mbps=udp_mbps, below_mbps=below_mbps, sizes=size_list,
                     progress=lambda msg: console.print(msg, highlight=False))
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        b.up()
        result = b.sweep(tuple(protos), repeats=repeats)
    except (LabError, OSError, RuntimeError) as e:
        fail(str(e))
    finally:
        b.down()
    doc = {"started": started, "command": "fathom bench vtap " + " ".join(shlex.quote(a) for a in sys.argv[3:]),
           "environment": report.environment(), "seconds": seconds, "repeats": repeats, "udp_mbps": udp_mbps, "sizes": list(size_list),
           **result}
    doc["ratios"] = vb.ratios(doc["points"])
    files = vb.write(doc, out)
    if as_json:
        return print_json(doc)
    console.print(vb.markdown(doc), highlight=False)
    console.print("files: " + ", ".join(files))


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
