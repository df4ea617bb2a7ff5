"""Hosts for running docs/deploy.md as written: a controller host and nodes that share nothing with
each other but the kernel. Each host is a network namespace `<prefix>-<host>` and a mount namespace
of its own, where the directories the doc writes to are overlays of the machine's (/etc, /var/lib,
/var/log, /root, /usr/local, /opt: what the host writes stays in the test's directory; fathom's and
OVS's own directories start empty), /run is an empty tmpfs, and /opt/fathom is this checkout (the
doc's `git clone` and `scripts/setup`).

What the doc leaves to the machine is played by small programs first on the PATH: `sudo` runs the
command (`-E` kept the environment anyway), `apt-get` checks the package is installed, `modprobe`
fails (this kernel has no modules), and `systemctl` starts a unit as systemd would: fathom's units
from their ExecStart and EnvironmentFile, `openvswitch-switch` with Debian's ovs-ctl, haproxy.

A management switch (198.18.128.0/24) and an underlay switch join the hosts: Linux bridges in the
namespace `<prefix>-sw`. Each host's eth0 is on the management switch; a node's eth1 on the underlay.
"""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from fathom.host import exec as host_exec
from fathom.host.exec import run

ROOT = Path(__file__).resolve().parents[2]
OVERLAID = ("/etc", "/var/lib", "/var/log", "/root", "/usr/local", "/opt")
# what this machine may hold of its own runs: a new host has none of it
EMPTIED = ("/etc/fathom", "/var/lib/fathom", "/var/lib/fathom-agent", "/etc/openvswitch", "/var/log/openvswitch")

SUDO = '#!/bin/sh\n[ "$1" = -E ] && shift\nexec "$@"\n'
APT_GET = ('#!/bin/sh\n# the test machine has what the doc installs: say so, install nothing\n'
           'shift; [ "$1" = -y ] && shift\nfor p in "$@"; do dpkg -s "$p" >/dev/null || exit 1; done\n')
MODPROBE = '#!/bin/sh\nexit 1\n'
SYSTEMCTL = r'''#!/bin/bash
# systemd's part for the test's hosts: start a unit in the background, as `enable --now` would
set -e
case "$1" in
  daemon-reload) exit 0 ;;
  enable) shift; [ "$1" = --now ] && shift ;;
  reload|restart|start) shift ;;
  *) echo "systemctl $*: not played by the test" >&2; exit 1 ;;
esac
unit=${1%.service}
case $unit in
  haproxy)      # Debian's unit: EnvironmentFile=-/etc/default/haproxy, the configuration checked first
    set -a; . /etc/default/haproxy; set +a
    haproxy -c -q -f /etc/haproxy/haproxy.cfg
    [ -f /run/haproxy.pid ] && kill "$(cat /run/haproxy.pid)" 2>/dev/null || true
    haproxy -D -p /run/haproxy.pid -f /etc/haproxy/haproxy.cfg ;;
  openvswitch-switch) /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/run/ovs-ctl.log 2>&1 ;;
  fathom-*)
    f=/etc/systemd/system/$unit.service
    env=$(sed -n 's/^EnvironmentFile=//p' "$f")
    set -a; . "$env"; set +a
    for d in $(sed -n 's/^StateDirectory=//p' "$f"); do install -d -m 0700 "/var/lib/$d"; done
    cmd=$(sed -n '/^ExecStart=/,/[^\\]$/p' "$f" | sed 's/^ExecStart=//; s/\\$//' | tr '\n' ' ')
    eval "setsid $cmd" >"/run/$unit.log" 2>&1 </dev/null &
    echo $! >"/run/$unit.pid" ;;
  *) echo "systemctl: unit $unit not played by the test" >&2; exit 1 ;;
esac
'''


class Host:
    def __init__(self, prefix: str, name: str, shims: Path):
        self.name, self.ns, self.shims = name, f"{prefix}-{name}", shims
        self.dir = shims.parent / name             # the upper layers of its overlays
        self.state = shims.parent / f"{name}.env"
        self.pid: int | None = None

    def start(self, cwd: str) -> None:
        """The namespaces; a process (sleep) holds the mount namespace for the blocks run later."""
        mounts = []
        for d in OVERLAID:
            upper, work = self.dir / d.strip("/").replace("/", "-"), self.dir / (d.strip("/").replace("/", "-") + ".work")
            upper.mkdir(parents=True)
            work.mkdir()
            mounts.append(f"mount -t overlay overlay -o lowerdir={d},upperdir={upper},workdir={work} {d}")
        mounts += ["mount -t tmpfs -o mode=0755 tmpfs /run", f"rm -rf {' '.join(EMPTIED)}",
                   "mkdir -p /opt/fathom /run/openvswitch /usr/local/bin",
                   f"mount --bind {shlex.quote(str(ROOT))} /opt/fathom",
                   "ln -sf /opt/fathom/.venv/bin/fathom /usr/local/bin/fathom"]  # the doc's `ln -s`
        self.proc = subprocess.Popen(host_exec.argv(["unshare", "--mount", "--propagation",
                                      "private", "sh", "-e", "-c", "; ".join(mounts) + "; echo ready; exec sleep infinity"], self.ns),
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready", f"{self.name}: mounts failed"
        self.pid = self.proc.pid
        self.state.write_text(f"cd {cwd}\n")

    def path(self, p: str) -> Path:
        """A file of this host, seen from outside (its mount namespace's root)."""
        return Path(f"/proc/{self.pid}/root{p}")

    def sh(self, script: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a block in this host, in bash -e, carrying the working directory and exported variables
        from the previous block (as one shell session on the host would)."""
        wrapped = (f"export PATH={self.shims}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
                   f". {self.state}\nset -e\n{script}\n"
                   f"{{ export -p; echo cd $(printf %q \"$PWD\"); }} > {self.state}\n")
        return subprocess.run(["nsenter", "-t", str(self.pid), "-m", "-n", "bash", "-c", wrapped],
                              capture_output=True, text=True, timeout=timeout, env={"HOME": "/root", "TERM": "dumb"})

    def stop(self) -> None:
        if self.pid:
            # what its units started: every process in the host's mount namespace
            me = Path(f"/proc/{self.pid}/ns/mnt").readlink()
            for proc in Path("/proc").iterdir():
                if proc.name.isdigit():
                    try:
                        if (proc / "ns/mnt").readlink() == me:
                            run(["kill", "-9", proc.name], check=False)
                    except OSError:
                        pass
        run(["ip", "netns", "del", self.ns], check=False)


def make_shims(d: Path) -> Path:
    shims = d / "bin"
    shims.mkdir(parents=True, exist_ok=True)
    for name, text in (("sudo", SUDO), ("apt-get", APT_GET), ("modprobe", MODPROBE), ("systemctl", SYSTEMCTL)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    return shims


def wire(prefix: str, hosts: dict[str, Host], mgmt_ips: dict[str, str], nodes: list[str]) -> None:
    """The switch namespace with bridges `mgmt` and `ul`; eth0 of every host on mgmt, eth1 of each node on ul."""
    sw = f"{prefix}-sw"
    for ns in [sw] + [h.ns for h in hosts.values()]:
        run(["ip", "netns", "add", ns])
        run(["ip", "link", "set", "lo", "up"], ns)
    for br in ("mgmt", "ul"):
        run(["ip", "link", "add", br, "type", "bridge"], sw)
        run(["ip", "link", "set", br, "up"], sw)
    for i, (name, h) in enumerate(hosts.items()):
        for dev, br in [("eth0", "mgmt")] + ([("eth1", "ul")] if name in nodes else []):
            peer = f"{dev[-1]}{i}"
            run(["ip", "link", "add", dev, "netns", h.ns, "type", "veth", "peer", "name", peer, "netns", sw])
            run(["ip", "link", "set", peer, "master", br, "up"], sw)
            run(["ip", "link", "set", dev, "up"], h.ns)
        run(["ip", "addr", "add", f"{mgmt_ips[name]}/24", "dev", "eth0"], h.ns)
