"""`fathom bench external`: added to the `bench` group of fathom/cli/bench.py."""
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


@bench.command("external")
@click.option("--quick", is_flag=True, help="2 s runs, 1 repeat")
@click.option("--seconds", type=int, default=5, show_default=True, help="length of each iperf3 run")
@click.option("--repeats", type=int, default=3, show_default=True, help="interleaved repeats of every path")
@click.option("--lab", "lab_name", default="exbench", show_default=True, help="name of the lab built for the run")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False),
              help="default results/bench-external-<timestamp>/")
@click.option("--json", "as_json", is_flag=True)
def external(quick, seconds, repeats, lab_name, outdir, as_json):
    """Floating-IP and SNAT paths against the internal path: TCP throughput and RTT (docs/external.md)."""
    from fathom.bench import external as eb
    from fathom.lab.sh import LabError
    if quick:
        seconds, repeats = 2, 1
    out = Path(outdir or f"results/bench-external-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("starting", total=1.0)
        b = eb.ExternalBench(lab_name=lab_name, seconds=seconds, repeats=repeats,
                             progress=lambda msg, frac=None: progress.update(task, description=msg,
                                                                              **({} if frac is None else {"completed": frac})))
        try:
            doc = b.run()
        except (LabError, OSError, RuntimeError) as e:
            fail(str(e))
    doc["command"] = "fathom bench external " + " ".join(shlex.quote(a) for a in sys.argv[3:])
    (out / "results.json").write_text(json.dumps(doc, indent=2))
    (out / "summary.md").write_text(eb.markdown(doc))
    if as_json:
        return print_json(doc)
    console.print(eb.markdown(doc), highlight=False)
    console.print(f"report: {out}/summary.md")
