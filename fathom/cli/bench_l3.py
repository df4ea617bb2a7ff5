"""`fathom bench l3`: added to the `bench` group of fathom/cli/bench.py."""
from __future__ import annotations

import click

from fathom.cli.bench import bench, output_dir, progress_bar, publish
from fathom.cli.output import fail


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
    out = output_dir("l3", outdir)
    with progress_bar() as progress:
        b = lb.L3Bench(lab_name=lab_name, seconds=seconds, repeats=repeats, udp_mbps=udp_mbps, progress=progress)
        try:
            doc = b.run()
        except (LabError, OSError, RuntimeError) as e:
            fail(str(e))
    publish("l3", doc, out, lb, as_json, plot="l3.png")
