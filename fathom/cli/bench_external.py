"""`fathom bench external`: added to the `bench` group of fathom/cli/bench.py."""
from __future__ import annotations

import click

from fathom.cli.bench import bench, output_dir, progress_bar, publish
from fathom.cli.output import fail


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
    out = output_dir("external", outdir)
    with progress_bar() as progress:
        b = eb.ExternalBench(lab_name=lab_name, seconds=seconds, repeats=repeats, progress=progress)
        try:
            doc = b.run()
        except (LabError, OSError, RuntimeError) as e:
            fail(str(e))
    publish("external", doc, out, eb, as_json)
