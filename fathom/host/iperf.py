"""iperf3 between two network namespaces: the throughput witness of benchmarks, the demo and the
lab tests.

    result = iperf3("lab-vm1", "lab-vm3", "10.0.0.13", seconds=2)       # TCP
    result.gbps, result.retransmits
    result = iperf3(client_ns, server_ns, ip, udp_mbps=500, length=1400)  # UDP at an offered load
    result.gbps, result.loss_percent                                      # as the receiver counted

For a client run that must be wrapped (e.g. in a CPU measurement), use the parts:
`with server(ns, ip): out = <run client_args(ip, ...) in the client ns>; parse(out, udp)`.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import time
from dataclasses import dataclass

from fathom.host import exec as host_exec

PORT = 5201


@dataclass
class Result:
    end: dict              # iperf3's "end" section
    udp: bool

    @property
    def received(self) -> dict:
        """What the receiver counted (UDP: `sum_received` where iperf3 has it, else `sum`)."""
        if self.udp:
            return self.end.get("sum_received", self.end.get("sum", {}))
        return self.end["sum_received"]

    @property
    def gbps(self) -> float:
        return self.received["bits_per_second"] / 1e9

    @property
    def bytes(self) -> int:
        return self.received["bytes"]

    @property
    def loss_percent(self) -> float | None:
        return self.received.get("lost_percent") if self.udp else None

    @property
    def retransmits(self) -> int | None:
        return None if self.udp else self.end.get("sum_sent", {}).get("retransmits")


@contextlib.contextmanager
def server(ns: str, bind_ip: str | None = None, port: int = PORT, ready_timeout: float = 5.0):
    """`iperf3 -s -1` (one test, then it exits) in namespace `ns`, listening before the block runs;
    stopped after it."""
    cmd = ["iperf3", "-s", "-1", "-p", str(port)] + (["-B", bind_ip] if bind_ip else [])
    proc = subprocess.Popen(host_exec.argv(cmd, ns), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and proc.poll() is None:
            listening = host_exec.run(["ss", "-Hltn", f"sport = :{port}"], ns, check=False, timeout=5).stdout
            if listening.strip():
                break
            time.sleep(0.05)
        yield proc
    finally:
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def client_args(server_ip: str, *, seconds: float = 2, port: int = PORT, udp_mbps: float | None = None,
                length: int | None = None, omit: int = 0, mss: int | None = None, nbytes: str | None = None,
                rate: str | None = None) -> list[str]:
    """The iperf3 client command line. `nbytes` ("300K") sends that much instead of running for
    `seconds`; `rate` ("1G") caps TCP; `omit` drops the first seconds (TCP slow start)."""
    args = ["iperf3", "-c", server_ip, "-p", str(port), "-J"]
    args += ["-n", nbytes] if nbytes else ["-t", f"{seconds:g}"]
    if udp_mbps is not None:
        args += ["-u", "-b", f"{udp_mbps:g}M"]
    elif rate:
        args += ["-b", rate]
    if length:
        args += ["-l", str(length)]
    if omit:
        args += ["-O", str(omit)]
    if mss:
        args += ["-M", str(mss)]
    return args


def parse(stdout: str, udp: bool) -> Result:
    return Result(json.loads(stdout)["end"], udp)


def iperf3(client_ns: str, server_ns: str, server_ip: str, *, bind: bool = True, check: bool = True,
           **options) -> Result | None:
    """One iperf3 run client -> server (options: see client_args). With check=False a failed run
    gives None instead of raising CommandError."""
    seconds = options.get("seconds", 2)
    port = options.get("port", PORT)
    with server(server_ns, server_ip if bind else None, port):
        out = host_exec.run(client_args(server_ip, **options), client_ns, check=check, timeout=seconds + 30)
    if out.returncode != 0:
        return None
    try:
        return parse(out.stdout, options.get("udp_mbps") is not None)
    except (ValueError, KeyError):
        if check:
            raise
        return None
