"""Lab VNFs that do real work, from Debian packages, inside lab namespaces; and the web server
(nginx) and client (ApacheBench) of the service chain tests and benchmarks.

Every VNF is a router between its two ports (eth0 = ingress, eth1 = egress, both on one tenant
network): what arrives on eth0 leaves on eth1 and the other way round (policy routing by input
interface; eth1's address has no prefix route, so the VNF's own traffic leaves on eth0 unless it
comes from eth1's address). The chain steering hands it frames addressed to the port they arrive
on (docs/sfc.md), so a VNF needs nothing but ordinary IP forwarding. Kinds:

| kind | what it does | from |
|---|---|---|
| forward | IP forwarding only | the kernel |
| firewall | an nft forward chain of `rules` rules no chain traffic matches (every packet is checked against all), then accept | nftables |
| nat | source NAT of everything leaving eth1 to eth1's address (the paper's "full NAT") | nftables |
| dpi | forwarding, with nDPI's `ndpiReader` inspecting what arrives on eth0; `stop_dpi` ends it and returns the protocols it detected | libndpi-bin |
| haproxy | TCP to port `backend`'s port arriving on eth0 is redirected to a local HAProxy that opens its own connection to `backend` from eth1: it terminates TCP (the paper's counter-example: in-band options and sequence numbers do not cross it) | haproxy |

Daemons run in the VNF's namespace with their pid files and logs in the lab's run dir
(`/run/fathom/<lab>/<vnf>/`); `fathom lab down` kills every process of the lab's namespaces.
"""
from __future__ import annotations

import ipaddress
import re
import signal
import subprocess
import time
from pathlib import Path

from fathom.host.exec import argv

from .sh import LabError, run

TABLE_FORWARD, TABLE_BACK = 100, 101
HAPROXY_PORT = 8080


def configure(ns: str, vnf, cidr: ipaddress.IPv4Network, rundir: Path) -> None:
    """Routing between the two ports, then the work of the VNF's kind."""
    rundir.mkdir(parents=True, exist_ok=True)
    for key in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
                "net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.all.arp_ignore=1",
                "net.ipv4.conf.all.arp_announce=2"):
        run(["sysctl", "-qw", key], ns=ns)
    for dev in ("eth0", "eth1"):
        run(["sysctl", "-qw", f"net.ipv4.conf.{dev}.rp_filter=0"], ns=ns)
    prefix = cidr.prefixlen
    run(["ip", "addr", "add", f"{vnf.ingress.ip.ip}/{prefix}", "dev", "eth0"], ns=ns)
    run(["ip", "addr", "add", f"{vnf.egress.ip.ip}/{prefix}", "dev", "eth1", "noprefixroute"], ns=ns)
    run(["ip", "route", "add", str(cidr), "dev", "eth1", "table", TABLE_FORWARD], ns=ns)
    run(["ip", "route", "add", str(cidr), "dev", "eth0", "table", TABLE_BACK], ns=ns)
    run(["ip", "rule", "add", "iif", "eth0", "table", TABLE_FORWARD, "priority", 100], ns=ns)
    run(["ip", "rule", "add", "from", str(vnf.egress.ip.ip), "table", TABLE_FORWARD, "priority", 101], ns=ns)
    run(["ip", "rule", "add", "iif", "eth1", "table", TABLE_BACK, "priority", 102], ns=ns)
    if vnf.kind == "firewall":
        run(["nft", "-f", "-"], ns=ns, input=firewall_rules(vnf.rules))
    elif vnf.kind == "nat":
        run(["nft", "-f", "-"], ns=ns, input=f"""table ip fathom_nat {{
  chain postrouting {{ type nat hook postrouting priority srcnat; policy accept;
    oifname "eth1" snat to {vnf.egress.ip.ip}
  }}
}}
""")
    elif vnf.kind == "dpi":
        _start(ns, ["ndpiReader", "-i", "eth0", "-v", "1"], rundir, "ndpiReader")
    elif vnf.kind == "haproxy":
        host, _, port = vnf.backend.partition(":")
        conf = rundir / "haproxy.cfg"
        conf.write_text(f"""global
  pidfile {rundir / 'haproxy.pid'}
  maxconn 4096
defaults
  mode tcp
  timeout connect 5s
  timeout client 30s
  timeout server 30s
frontend chain
  bind {vnf.ingress.ip.ip}:{HAPROXY_PORT}
  default_backend web
backend web
  source {vnf.egress.ip.ip}
  server web {host}:{port}
""")
        run(["nft", "-f", "-"], ns=ns, input=f"""table ip fathom_haproxy {{
  chain prerouting {{ type nat hook prerouting priority dstnat; policy accept;
    iifname "eth0" ip daddr {host} tcp dport {port} redirect to :{HAPROXY_PORT}
  }}
}}
""")
        run(["haproxy", "-D", "-f", str(conf)], ns=ns)


def firewall_rules(n: int) -> str:
    """An nft forward chain of `n` rules that chain traffic never matches (sources in TEST-NET-3,
    203.0.113.0/24), so every packet is checked against all of them, then accepted."""
    rules = "\n".join(f"    ip saddr 203.0.113.{i % 254 + 1} tcp dport {1 + i // 254} drop" for i in range(n))
    return f"""table inet fathom_fw {{
  chain forward {{ type filter hook forward priority filter; policy accept;
{rules}
  }}
}}
"""


def _start(ns: str, cmd: list[str], rundir: Path, name: str) -> int:
    log = open(rundir / f"{name}.log", "wb")
    proc = subprocess.Popen(argv(cmd, ns), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (rundir / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def _stop(rundir: Path, name: str, sig=signal.SIGINT, timeout: float = 10) -> None:
    import os
    try:
        pid = int((rundir / f"{name}.pid").read_text())
    except (OSError, ValueError):
        raise LabError(f"{name} is not running in {rundir}") from None
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            if not Path(f"/proc/{pid}").exists():
                return
        time.sleep(0.1)
    raise LabError(f"{name} (pid {pid}) did not stop within {timeout:g}s")


def stop_dpi(rundir: Path) -> dict[str, dict[str, int]]:
    """End a dpi VNF's ndpiReader; the protocols it detected: {name: {packets, bytes, flows}}."""
    _stop(rundir, "ndpiReader")
    text = (rundir / "ndpiReader.log").read_text(errors="replace")
    out = {}
    section = text.split("Detected protocols:", 1)[1] if "Detected protocols:" in text else ""
    for line in section.splitlines()[1:]:
        m = re.match(r"\s+(\S+)\s+packets:\s*(\d+)\s+bytes:\s*(\d+)\s+flows:\s*(\d+)", line)
        if not m:
            break
        out[m.group(1)] = {"packets": int(m.group(2)), "bytes": int(m.group(3)), "flows": int(m.group(4))}
    return out


# ---------------------------------------------------------------------------------------------- web


def start_web(ns: str, rundir: Path, root: Path, port: int = 80) -> None:
    """nginx serving `root` on `port` in namespace `ns` (config, pid and logs in `rundir`)."""
    rundir.mkdir(parents=True, exist_ok=True)
    conf = rundir / "nginx.conf"
    conf.write_text(f"""user root;
worker_processes 1;
pid {rundir / 'nginx.pid'};
error_log {rundir / 'nginx-error.log'};
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {rundir};
  keepalive_requests 100000;
  server {{
    listen {port};
    root {root};
  }}
}}
""")
    run(["nginx", "-c", str(conf)], ns=ns)


def ab(ns: str, url: str, requests: int, concurrency: int = 1, timeout: float = 120,
       seconds: float | None = None) -> dict:
    """ApacheBench from namespace `ns`: requests/s, complete and failed requests, mean time. With
    `seconds`, it stops after that long (or after `requests`, whichever comes first)."""
    limit = ["-t", seconds] if seconds else []
    out = run(["ab", "-q", *limit, "-n", requests, "-c", concurrency, url], ns=ns, timeout=timeout).stdout

    def number(label: str) -> float:
        m = re.search(rf"^{re.escape(label)}:\s+([\d.]+)", out, re.M)
        if not m:
            raise LabError(f"ab printed no {label!r}:\n{out[-2000:]}")
        return float(m.group(1))
    return {"requests_per_s": number("Requests per second"), "complete": int(number("Complete requests")),
            "failed": int(number("Failed requests")), "time_per_request_ms": number("Time per request")}
