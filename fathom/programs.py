"""Every external program that fathom, its tests and its benchmarks run, and the Debian package that
provides it: the one list. `scripts/setup` installs these packages and then checks that each program is
present; "not found" errors everywhere quote this list. A unit test scans the code for programs it runs
and fails on any that is missing here.

Run as a script (no third-party imports, so it works before the virtualenv exists):
    python3 fathom/programs.py packages   # the Debian packages to install, one per line
    python3 fathom/programs.py check      # exit 1 naming every program that is not installed
"""
from __future__ import annotations

import os
import shutil
import sys

# program -> (Debian package, what fathom uses it for)
PROGRAMS: dict[str, tuple[str, str]] = {
    # Open vSwitch: the data plane of every node, the fabric switch and the benchmarked switch
    "ovsdb-server": ("openvswitch-switch", "each lab node's OVSDB"),
    "ovs-vswitchd": ("openvswitch-switch", "each lab node's switch"),
    "ovsdb-tool": ("openvswitch-common", "creating a node's OVSDB"),
    "ovsdb-client": ("openvswitch-common", "writing a simulated node's OVSDB (fathom bench scale)"),
    "ovs-vsctl": ("openvswitch-common", "configuring bridges and ports"),
    "ovs-ofctl": ("openvswitch-common", "reading flows and groups"),
    "ovs-appctl": ("openvswitch-common", "traces, counters, daemon control"),
    "ovsdb-client": ("openvswitch-common", "watching OVN's Northbound database in ovn-compare"),
    # OVN 23.03, run by `fathom bench ovn-compare` only (its own daemons; the packaged services never run)
    "ovn-northd": ("ovn-central", "OVN's central translator in ovn-compare"),
    "ovn-controller": ("ovn-host", "OVN's per-node agent in ovn-compare"),
    "ovn-nbctl": ("ovn-common", "writing the tenant to OVN's Northbound database"),
    "ovn-sbctl": ("ovn-common", "reading OVN's Southbound database"),
    # the host's network stack
    "ip": ("iproute2", "namespaces, veth, addresses, routes"),
    "tc": ("iproute2", "clsact qdiscs, eBPF attach checks, policers"),
    "bridge": ("iproute2", "Linux bridge forwarding entries"),
    "ss": ("iproute2", "socket state in the demo"),
    "nstat": ("iproute2", "kernel SNMP counters"),
    "ethtool": ("ethtool", "offload settings of veth ends"),
    "dnsmasq": ("dnsmasq-base", "the node agent's DHCP server of each network (static leases)"),
    "udhcpc": ("udhcpc", "lab VMs that take their address by DHCP"),
    "sysctl": ("procps", "per-namespace kernel settings"),
    "pgrep": ("procps", "finding daemons in tests"),
    "ping": ("iputils-ping", "reachability checks"),
    "iptables": ("iptables", "firewall VNFs of PPTMon chains"),
    "iptables-restore": ("iptables", "loading firewall rule sets"),
    "nft": ("nftables", "benchmark devices' forwarding rules; firewall, NAT and proxy VNFs of the lab"),
    "mount": ("mount", "mounting bpffs"),
    "umount": ("mount", "unmounting a test's bpffs"),
    "taskset": ("util-linux", "pinning a generator to one core"),
    "setpriv": ("util-linux", "running a command without root in tests"),
    "nsenter": ("util-linux", "a lab node's agent in the node's network namespace only"),
    "unshare": ("util-linux", "hosts with mounts of their own for docs/deploy.md's test"),
    "strace": ("strace", "checking that the controller enters no namespace (lab test)"),
    "runuser": ("util-linux", "running PostgreSQL as its own user"),
    "timeout": ("coreutils", "bounding benchmark helper commands"),
    "cat": ("coreutils", "reading interface counters in a namespace"),
    "stat": ("coreutils", "a namespace file's inode in tests"),
    "rm": ("coreutils", "removing benchmark run directories"),
    "kill": ("procps", "killing daemons in failure tests"),
    "sh": ("dash", "shell one-liners in tests"),
    "bash": ("bash", "the docs' command blocks, run as written (tests/lab/test_docs.py)"),
    "jq": ("jq", "picking fields of JSON answers in the docs' command blocks"),
    "openssl": ("openssl", "the API proxy's certificate in docs/deploy.md"),
    "true": ("coreutils", "a command that succeeds, in tests"),
    "sleep": ("coreutils", "a command that takes time, in tests"),
    # traffic and independent witnesses
    "iperf3": ("iperf3", "TCP/UDP throughput"),
    "tcpdump": ("tcpdump", "captures"),
    "tshark": ("tshark", "decoding captures"),
    "curl": ("curl", "HTTP requests from VMs in the demo"),
    "nc": ("netcat-openbsd", "TCP and UDP connections through security groups in lab tests"),
    "trafgen": ("netsniff-ng", "peer packet generator in the switch benchmark"),
    "nfacctd": ("pmacct", "an external IPFIX collector the flow records' export is tested against"),
    # lab VNFs and the web workload of service chains (fathom/lab/vnf.py)
    "ndpiReader": ("libndpi-bin", "the DPI VNF (nDPI)"),
    "haproxy": ("haproxy", "the TCP-terminating proxy VNF; the reverse proxy in front of the API (deploy/haproxy)"),
    "nginx": ("nginx-light", "the web server behind a service chain"),
    "ab": ("apache2-utils", "ApacheBench, the web client of service chain tests and benchmarks"),
    # native build: eBPF programs and the traffic engine
    "make": ("make", "building native/"),
    "gcc": ("gcc", "the traffic engine and loaders"),
    "clang": ("clang", "eBPF objects"),
    "bpftool": ("bpftool", "skeletons and program inspection"),
    "pkg-config": ("pkg-config", "libbpf flags"),
    # the store's tests against a real PostgreSQL
    "initdb": ("postgresql", "throw-away PostgreSQL clusters"),
    "pg_ctl": ("postgresql", "starting and stopping them"),
    "postgres": ("postgresql", "the PostgreSQL server"),
    # the web console: its front-end packages (npm ci) and the headless browser of its tests
    "npm": ("npm", "installing the console's front-end packages (fathom/console/package-lock.json)"),
    "chromium": ("chromium", "the browser of the console's tests (headless)"),
    "chromedriver": ("chromium-driver", "driving that browser from the tests (selenium)"),
    # the alert rules of deploy/prometheus, checked and fired in a real Prometheus by their test
    "prometheus": ("prometheus", "evaluating deploy/prometheus/fathom-alerts.yml against a controller"),
    "promtool": ("prometheus", "checking deploy/prometheus/fathom-alerts.yml"),
    # the virtualenv
    "python3": ("python3", "fathom itself"),
}

# Packages that provide no program fathom calls by name: libraries the native build links against and
# what the virtualenv needs.
LIBRARIES: dict[str, str] = {
    "libbpf-dev": "eBPF loaders",
    "libelf-dev": "libbpf's dependency",
    "zlib1g-dev": "libbpf's dependency",
    "python3-venv": "the .venv",
    "python3-dev": "wheels built from source",
}

# Directories outside PATH where Debian puts some of these programs.
EXTRA_DIRS = ("/usr/sbin", "/sbin", "/usr/lib/postgresql/15/bin")


class ProgramMissing(RuntimeError):
    pass


def path(program: str) -> str | None:
    """Where `program` is installed, or None."""
    found = shutil.which(program)
    if found:
        return found
    for d in EXTRA_DIRS:
        candidate = os.path.join(d, program)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def missing_message(program: str) -> str:
    package = PROGRAMS.get(program, (None,))[0]
    hint = f"Debian package {package}; run 'sudo scripts/setup'" if package else "not a program fathom knows"
    return f"{program} not found ({hint})"


def require(*programs: str) -> None:
    """Raise ProgramMissing naming every one of `programs` that is not installed."""
    missing = [p for p in programs if path(p) is None]
    if missing:
        raise ProgramMissing("; ".join(missing_message(p) for p in missing))


def packages() -> list[str]:
    return sorted({pkg for pkg, _ in PROGRAMS.values()} | set(LIBRARIES))


def _main(argv: list[str]) -> int:
    if argv == ["packages"]:
        print("\n".join(packages()))
        return 0
    if argv == ["check"]:
        missing = [p for p in PROGRAMS if path(p) is None]
        for p in missing:
            print(missing_message(p), file=sys.stderr)
        return 1 if missing else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
