"""`fathom bench l3`: added to the `bench` group of fathom/cli/bench.py."""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from fathom.cli.bench import bench
from fathom.cli.output import console, fail, print_json


@bench.command("l3")
@click.option("--quick", is_flag=True, help="2 s runs, 1 repeat")
@click.option("--seconds", type=int, default=5, show_default=True, help="length of each iperf3 run")
@click.option("--repeats", type=int, default=3, show_default=True, help="interleaved repeats of every path")
@click.option("--udp-mbps", type=int, default=1000, show_default=True, help="UDP offered load")
@click.option("--lab", "lab_name", default="tfl3", show_default=True, help="name of the lab built for the run")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False), help="default results/bench-l3-<timestamp>/")
@click.option("--json", "as_json", is_flag=True)
def l3(quick, seconds, repeats, udp_mbps, lab_name, outdir, as_json):
    """L2 and L3 in each router mode (distributed, fabric, network-node): TCP/UDP, RTT, node CPU and memory."""
    from fathom.bench import l3 as lb
    from fathom.lab.sh import LabError
    if quick:
        seconds, repeats = 2, 1
    out = Path(outdir or f"results/bench-l3-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("starting", total=1.0)
        b = lb.L3Bench(lab_name=lab_name, seconds=seconds, repeats=repeats, udp_mbps=udp_mbps,
                       progress=lambda msg, frac=None: progress.update(task, description=msg,
                                                                        **({} if frac is None else {"completed": frac})))
        try:
            doc = b.run()
        except (LabError, OSError, RuntimeError) as e:
            fail(str(e))
    doc["command"] = "fathom bench l3 " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    (out / "results.json").write_text(json.dumps(doc, indent=2))
    (out / "summary.md").write_text(lb.markdown(doc))
    lb.plot(doc, out / "l3.png")
    if as_json:
        return print_json(doc)
    console.print(lb.markdown(doc), highlight=False)
    console.print(f"report: {out}/summary.md, plot {out}/l3.png")
