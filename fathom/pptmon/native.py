"""Paths to the native PPTMon tools and a driver for the BPF_PROG_TEST_RUN runner."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("FATHOM_PPTMON_BUILD", ROOT / "native" / "pptmon" / "build"))
LOADER = BUILD / "pptmon-loader"
TESTRUN = BUILD / "pptmon-testrun"
LIVETRACE_TESTRUN = BUILD / "livetrace-testrun"     # the live trace programs' (native/pptmon/livetrace-testrun.c)

IN_NONE, IN_SOURCE, IN_TRANSIT = 0, 1, 2


def built() -> bool:
    return LOADER.exists() and TESTRUN.exists()


class TestRunner:
    """One loaded copy of the programs; each call runs one packet through one program. `program`:
    the runner (PPTMon's; LIVETRACE_TESTRUN drives the live trace's, through `cmd`)."""

    __test__ = False  # not a pytest class

    def __init__(self, program: Path = TESTRUN) -> None:
        self.fallible = 0
        self.proc = subprocess.Popen([str(program)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def cmd(self, line: str) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        if not out:
            raise RuntimeError(f"{self.proc.args[0]} exited")
        reply = json.loads(out)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def config(self, in_role: int = IN_NONE, sink: bool = False, vnf: int = 1,
               period_ns: int = 0, mtu: int = 0, enabled: bool = True) -> None:
        self.cmd(f"cfg {in_role} {int(sink)} {vnf} {period_ns} {mtu} {int(enabled)}")

    def gso(self, segs: int, size: int) -> None:
        self.cmd(f"gso {segs} {size}")

    def csum_complete(self, on: bool) -> None:
        """Run the next packets as CHECKSUM_COMPLETE skbs: the kernel computes skb->csum
        before the program and fails the run (EBADMSG) if the program left it wrong."""
        self.cmd(f"csum {int(on)}")

    def fault(self, nth: int) -> None:
        """Make the nth fallible helper call of every following run fail (0: none)."""
        self.cmd(f"fault {nth}")

    def reset_sampling(self) -> None:
        self.cmd("reset")

    def run(self, prog: str, pkt: bytes) -> tuple[int, bytes, list[dict]]:
        r = self.cmd(f"run {prog} {pkt.hex()}")
        self.fallible = r["fallible"]  # fallible helper calls the run made
        return r["retval"], bytes.fromhex(r["data"]), r["records"]

    def stats(self) -> dict:
        return self.cmd("stats")

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=5)
