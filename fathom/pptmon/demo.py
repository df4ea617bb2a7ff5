"""PPTMon demo: a 3-VNF chain (firewall, NAT, forwarder) with per-VNF and end-to-end times.

`python -m fathom.pptmon.demo [--keep]` on its own, or `section(console, report)` from
`make demo` (fathom/demo.py).
"""
from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from fathom.pptmon import chain as chainmod
from fathom.pptmon import control, measure, stats

CHAIN = "ppdemo"


def section(console: Console, report: list, keep: bool = False, name: str = CHAIN) -> dict:
    """The chain `name` up, measured, and down again (unless `keep`)."""
    console.rule("[bold]PPTMon: processing time per VNF, carried in-band (the PPTMon paper)")
    c = chainmod.Chain(name=name, vnfs=chainmod.parse_vnfs("firewall:200,nat,forward"), base=230)
    control.down(name)
    try:
        with console.status("chain up: client - firewall(200 rules) - NAT - forwarder - server"):
            chainmod.up(c)
            control.enable(name, period_ns=10_000_000)  # 100 samples/s
        with console.status("TCP and UDP through the chain, sampled every 10 ms"):
            sent, got = measure.transfer(c, "tcp", bytes=2_000_000)
            usent, ugot = measure.transfer(c, "udp", count=2000, rate=2000)
        recs = control.records(name)
        s = stats.chain_stats(recs)
        t = Table(title=f"{name}: {s['records']} sampled packets (µs)", title_justify="left")
        for col in ("VNF", "kind", "n", "p50", "p90", "p99", "mean"):
            t.add_column(col)
        for k, v in s["vnfs"].items():
            t.add_row(f"vnf{k}", c.vnfs[k - 1].label(), str(v["count"]), f"{v['p50_us']:.1f}",
                      f"{v['p90_us']:.1f}", f"{v['p99_us']:.1f}", f"{v['mean_us']:.1f}")
        e = s["e2e"]
        if e["count"]:
            t.add_row("end to end", "sum", str(e["count"]), f"{e['p50_us']:.1f}", f"{e['p90_us']:.1f}",
                      f"{e['p99_us']:.1f}", f"{e['mean_us']:.1f}")
        console.print(t)
        intact = sent == got and usent == ugot
        report.append(("pptmon", f"{s['records']} records over 3 VNFs, end-to-end p50 "
                                 f"{e.get('p50_us', float('nan')):.1f} µs; payloads "
                                 f"{'byte-identical' if intact else 'DIFFER - FAILED'}"))
        return s
    finally:
        if not keep:
            control.down(name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fathom.pptmon.demo")
    ap.add_argument("--keep", action="store_true", help="leave the chain up (fathom pptmon chain down ppdemo)")
    a = ap.parse_args(argv)
    report: list = []
    console = Console()
    section(console, report, keep=a.keep)
    for k, v in report:
        console.print(f"[bold]{k}[/bold]: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
