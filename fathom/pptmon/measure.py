"""Traffic, captures and independent checks for PPTMon lab tests and benchmarks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fathom.host import exec as host_exec
from fathom.lab.capture import Capture, tshark
from fathom.pptmon.chain import Chain

PY = sys.executable


def transfer(chain: Chain, proto: str, v6: bool = False, port: int = 5301,
             timeout: float = 30, **client_opts) -> tuple[dict, dict]:
    """Run the deterministic traffic tool client -> server; return (sent, received)."""
    dst = chain.server_ip6 if v6 else chain.server_ip
    srv_args = ["server", proto, "--port", str(port)]
    if proto == "udp":
        srv_args += ["--count", str(client_opts.get("count", 400))]
    srv = subprocess.Popen(host_exec.argv([PY, "-m", "fathom.pptmon.traffic", *srv_args], chain.server),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = srv.stdout.readline()  # {"listening": port}
        if "listening" not in line:
            raise RuntimeError(f"traffic server did not start: {srv.stderr.read()}")
        args = ["client", proto, "--dst", dst, "--port", str(port)]
        for k, v in client_opts.items():
            for item in (v if isinstance(v, list) else [v]):
                args += [f"--{k}", str(item)]
        cli = subprocess.run(host_exec.argv([PY, "-m", "fathom.pptmon.traffic", *args], chain.client),
                             capture_output=True, text=True, timeout=timeout)
        if cli.returncode:
            raise RuntimeError(f"traffic client failed: {cli.stderr}")
        out, err = srv.communicate(timeout=timeout)
        if srv.returncode:
            raise RuntimeError(f"traffic server failed: {err}")
        return json.loads(cli.stdout.strip().splitlines()[-1]), json.loads(out.strip().splitlines()[-1])
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


def capture(ns: str, dev: str, path: Path, bpf_filter: str = "tcp or udp") -> Capture:
    """The reference capture of a measurement: nanosecond kernel timestamps, and not in immediate
    mode, which keeps the capture's own cost out of the path it measures (fathom.lab.capture)."""
    return Capture(ns, dev, path, bpf_filter, immediate=False, nano=True, buffer_kib=8192)


def bad_checksums(pcap: Path, dst: str | None = None) -> list[str]:
    """Packets (to dst, if given) whose IPv4, TCP or UDP checksum tshark finds wrong.  A
    capture on a sender's device holds its CHECKSUM_PARTIAL packets before the checksum is
    completed: select the packets it received with dst.  A TCP checksum of 0xFFFF where 0x0000
    is computed is the other one's-complement zero (RFC 1624 §3): receivers accept it and so does
    this check; the sink's incremental update leaves it on about one segment in 65,536."""
    where = ("(ip.checksum.status == 0 || (tcp.checksum.status == 0 && !tcp.checksum.ffff) || "
             "udp.checksum.status == 0)")
    if dst:
        where += f" && {'ipv6' if ':' in dst else 'ip'}.dst == {dst}"
    return tshark(pcap, "-o", "tcp.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
                  "-o", "ip.check_checksum:TRUE", "-Y", where)


# Display filter: a PPTMon option, or a UDP datagram shorter than its IP payload (a surplus
# area).  Datagrams reassembled from IP fragments are left out: their last fragment's IP
# length is not the datagram's.
MARKED = ("tcp.option_kind == 254 || (udp && !ip.fragments && !ipv6.fragments && "
          "((ip && ip.len - ip.hdr_len != udp.length) || (ipv6 && ipv6.plen != udp.length)))")


def leftovers(pcap: Path) -> list[str]:
    """Packets that still carry a PPTMon option or any UDP surplus area."""
    return tshark(pcap, "-Y", MARKED)


def l4_bytes(pcap: Path, src: str, proto: int = 6) -> list[bytes]:
    """The IP payload (L4 header and data, every byte as captured) of each IPv4 packet of
    `proto` from `src`, in capture order.  Needs a capture with the whole packet (-s 0)."""
    from scapy.all import IP, rdpcap
    out = []
    for pkt in rdpcap(str(pcap)):
        ip = pkt.getlayer(IP)
        if ip is None or ip.src != src or ip.proto != proto:
            continue
        raw = bytes(ip)
        ihl = (raw[0] & 0xF) * 4
        out.append(raw[ihl:ip.len])
    return out


def server_validates(chain: Chain) -> None:
    """Make the server check every TCP/UDP checksum in software: no RX checksum offload on
    its device (a veth marks CHECKSUM_NONE packets CHECKSUM_UNNECESSARY otherwise), and the
    checksums of packets still CHECKSUM_PARTIAL completed on the host-side veth towards it
    (no TX checksum offload there).  Upstream of that veth the chain keeps its offloads."""
    from fathom.pptmon.chain import run
    run("ethtool", "-K", "eth0", "rx", "off", ns=chain.server)
    run("ethtool", "-K", f"h{chain.n + 1}i", "tx", "off", ns=chain.host)


def marked_sizes(pcap: Path) -> dict[str, int]:
    """Largest IP packet (IPv4 total or IPv6 payload length + 40) carrying a PPTMon option,
    per protocol, in a capture taken inside the chain."""
    out: dict[str, int] = {}
    for line in tshark(pcap, "-Y", MARKED, "-T", "fields", "-e", "ip.len", "-e", "ipv6.plen", "-e", "ip.proto",
                       "-e", "ipv6.nxt"):
        parts = (line.split("\t") + ["", "", "", ""])[:4]
        size = int(parts[0]) if parts[0] else int(parts[1] or 0) + 40
        proto = "tcp" if "6" in (parts[2], parts[3]) else "udp"
        out[proto] = max(out.get(proto, 0), size)
    return out


def nstat(ns: str) -> dict:
    p = subprocess.run(host_exec.argv(["nstat", "-az", "--json"], ns), capture_output=True, text=True)
    data = json.loads(p.stdout or "{}")
    return data.get("kernel", data)


def timestamps(pcap: Path, proto: str = "udp") -> dict[tuple, float]:
    """{(ip.id, tcp seq or 0): first capture time (ns)} for IPv4 packets of proto."""
    fields = ["-T", "fields", "-e", "frame.time_epoch", "-e", "ip.id"]
    if proto == "tcp":
        fields += ["-e", "tcp.seq_raw"]
    out: dict[tuple, float] = {}
    for line in tshark(pcap, "-Y", f"ip && {proto}", *fields):
        parts = line.split("\t")
        sec, _, frac = parts[0].partition(".")
        t = int(sec) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])
        key = (int(parts[1], 16), int(parts[2]) if proto == "tcp" and len(parts) > 2 else 0)
        out.setdefault(key, t)
    return out


def accuracy(records: list[dict], t_in: dict, t_out: dict, hop: int = 0) -> dict:
    """Per packet: PPTMon's time for `hop` against capture(out) - capture(in) of the same
    packet.  Returns the matched pairs' summary (µs)."""
    from fathom.pptmon.stats import summarize

    pptm, ref, diff, tx, rx, pkts = [], [], [], [], [], []
    for r in records:
        f = r["flow"]
        key = (f["ip_id"], f["tcp_seq"] if f["proto"] == "tcp" else 0)
        if key in t_in and key in t_out and r["hops"][hop]["ppt_us"] is not None:
            rv = (t_out[key] - t_in[key]) / 1000.0
            pv = float(r["hops"][hop]["ppt_us"])
            pptm.append(pv)
            ref.append(rv)
            diff.append(rv - pv)
            t = None
            if hop == len(r["hops"]) - 1 and "time_ns" in r:
                # the sink's record carries its egress stamp (wall clock, ns): split the
                # difference into the part after it (to the transmit tap) and the rest
                t = (t_out[key] - r["time_ns"]) / 1000.0
                tx.append(t)
                rx.append(rv - pv - t)
            pkts.append((t_in[key], rv - pv, t))
    out = {"matched": len(diff), "pptmon": summarize(pptm), "reference": summarize(ref),
           "ref_minus_pptmon": summarize(diff)}
    if tx:
        out["after_egress_stamp"] = summarize(tx)
        out["before_ingress_stamp"] = summarize(rx)
    # packets that came right after another one (< 200 µs) against those after a pause
    pkts.sort()
    after = [(p, p[0] - q[0] < 200_000) for p, q in zip(pkts[1:], pkts)]
    for tag, warm in (("after_pause", False), ("right_after_another", True)):
        sel = [p for p, w in after if w == warm]
        if sel:
            out[f"ref_minus_pptmon_{tag}"] = summarize([d for _, d, _ in sel])
            if tx:
                out[f"after_egress_stamp_{tag}"] = summarize([t for _, _, t in sel if t is not None])
    return out


def env() -> dict:
    """The environment every result is recorded with."""
    ovs = subprocess.run(["ovs-vswitchd", "--version"], capture_output=True, text=True)
    return {"kernel": os.uname().release, "cpus": os.cpu_count(),
            "ovs": (ovs.stdout.splitlines() or ["?"])[0], "python": sys.version.split()[0]}
