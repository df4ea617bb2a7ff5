"""PPTMon attachments on this node: one pptmon-loader process per attachment.

A loader (native/pptmon) loads the programs, attaches `ppt_in` and `ppt_out` at TC on the named
interfaces of this namespace, pins its maps (so the period can be changed in place) and writes
JSON lines to `<root>/<chain>/vnf<k>-a<name>.jsonl` (name: the attachment's local name, its id for
an operator's attachment): an "attached" line, "stats" lines and, at a
sink, one "ppt" record per sampled packet, which the agent's record forwarder
(fathom.agent.agent) delivers to the controller with backoff.

A port chain's attachment names the br-int interfaces of its VNF's ports: the programs go on the
VM-facing interfaces behind them, decided here from the plugging (fathom.agent.plugging) — `pending`
while an interface is missing, `error` where the plugging cannot work (direct on OVS's netdev datapath).

A loader that has not attached within ATTACH_TIMEOUT (verifying the programs is slow on a crowded
host) keeps running and its attachment is `pending` until it says it attached; one that exits
before is an `error` with what it said on stderr.

Loaders run in their own session and outlive the agent: an agent restart finds them by their pid
files (`<state>/pptmon/<name>.json`, checked against the process's command line) and adopts them,
so the programs stay attached and nothing is measured twice. A loader that died is started again.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from fathom.agent.local import alive, links
from fathom.agent.plugging import vm_facing
from fathom.host.exec import run
from fathom.model.hostlocal import PptmonAttach, digest, owner_key
from fathom.pptmon import native

LOG = logging.getLogger("fathom.agent.pptmon")
# How long the agent waits for a loader to load, verify and attach its programs before it reports
# the attachment `pending` (still loading) and looks again every few seconds (the follower's busy
# interval). Verifying them took 2-3 s on a 2-core host at load 6, over 5 s at load 8.
ATTACH_TIMEOUT = 30.0
# A loader still not attached this long after its start is given up on (killed): `error`, tried
# again at the next resync.
LOAD_LIMIT = 600.0
# What a running loader is started with: a change of any of them starts it again (a port chain's
# `path` too, so that all of a chain's counters restart together; only the period is changed in place)
LOADER_KEYS = ("chain", "vnf_id", "mode", "in_point", "out_point", "path")


class StillLoading(Exception):
    """The loader runs but has not attached its programs yet: the attachment is `pending`."""


class Pptmon:
    KIND = PptmonAttach.KIND

    def __init__(self, root: Path, state_dir: Path, bpffs: Path, label_ns: str):
        self.root = Path(root)
        self.dir = Path(state_dir) / "pptmon"
        self.bpffs = Path(bpffs)
        self.label_ns = label_ns[:64]       # the records' vnf_ns: where the programs run
        # pins of this agent in the shared bpffs: named after its state directory (one agent each)
        self.tag = "agent-" + hashlib.sha256(str(self.dir.resolve()).encode()).hexdigest()[:12]

    # ----- what runs
    def _file(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def _running(self, name: str) -> dict | None:
        try:
            st = json.loads(self._file(name).read_text())
        except (OSError, ValueError):
            return None
        return st if self._is_loader(st.get("pid"), st.get("pin", "")) else None

    @staticmethod
    def _is_loader(pid, pin: str) -> bool:
        if not isinstance(pid, int) or not alive(pid):
            return False
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return any(c.endswith(b"pptmon-loader") for c in cmd) and pin.encode() in cmd

    def held(self) -> set[str]:
        """The local names (PptmonAttach.local_name) of the attachments this node holds."""
        return {p.stem for p in self.dir.glob("*.json") if re.fullmatch(r"[0-9]+|[a-z_]+-[0-9]+", p.stem)}

    # ----- apply
    def placed(self, obj: PptmonAttach, found: list[dict] | None = None) -> tuple[PptmonAttach | None, dict | None]:
        """The attachment as it runs here (a chain's points moved to the VM-facing interfaces,
        fathom.agent.plugging) or None with the status to report instead: `pending` while an
        interface is not there, `error` where the plugging cannot work."""
        if not obj.names_ports:
            return obj, None
        found = links(details=True) if found is None else found
        points = []
        for point in (obj.in_point, obj.out_point):
            dev, _, direction = point.partition(":")
            where = vm_facing(dev, self.label_ns, found)
            if where.interface is None:
                level = "pending" if where.plugging == "absent" else "error"
                return None, {"status": level, "reason": where.reason, "applied": digest([obj])}
            points.append(f"{where.interface}:{direction}")
        return replace(obj, in_point=points[0], out_point=points[1]), None

    def apply(self, objects: list[PptmonAttach]) -> dict[str, dict]:
        out = {}
        found = links(details=True) if any(o.names_ports for o in objects) else []
        kept = set()
        for obj in objects:
            try:
                here, refused = self.placed(obj, found)
                if refused is not None:
                    out[owner_key(obj.owner)] = refused
                    continue
                kept.add(obj.local_name)
                what = self.ensure(here)
                if what:
                    LOG.info("attachment %s: %s", obj.local_name, what)
                out[owner_key(obj.owner)] = {"status": "active", "reason": None, "applied": digest([obj])}
            except StillLoading as e:
                out[owner_key(obj.owner)] = {"status": "pending", "reason": str(e), "applied": digest([obj])}
            except Exception as e:  # noqa: BLE001 - the attachment's status; retried on the next resync
                LOG.warning("attachment %s: %s", obj.local_name, e)
                out[owner_key(obj.owner)] = {"status": "error", "reason": str(e)[:1000], "applied": digest([obj])}
        for gone in sorted(self.held() - kept):
            self.remove(gone)
        return out

    def ensure(self, obj: PptmonAttach) -> str | None:
        """Start, restart or adopt the attachment's loader; what was done, None if nothing. Raises
        StillLoading while the loader has not attached yet."""
        cur = self._running(obj.local_name)
        if cur is None:
            self._died_loading(obj.local_name)
        same = {k: getattr(obj, k) for k in LOADER_KEYS}
        if cur is not None and all(cur.get(k, "") == v for k, v in same.items()):
            what = self._loading(obj.local_name, cur) if not cur.get("attached", True) else None
            if cur.get("period_ns") != obj.period_ns:
                run([str(native.LOADER), "set", "--pin", cur["pin"], "--period-ns", str(obj.period_ns)])
                cur["period_ns"] = obj.period_ns
                self._save(obj.local_name, cur)
                return "; ".join(filter(None, (what, f"period {obj.period_ns} ns")))
            return what
        if cur is not None:
            self.remove(obj.local_name)
        return self.start(obj)

    def start(self, obj: PptmonAttach) -> str:
        if not native.LOADER.exists():
            raise RuntimeError(f"{native.LOADER} is missing (make -C native/pptmon)")
        for point in (obj.in_point, obj.out_point):
            dev = point.split(":")[0]
            if run(["ip", "link", "show", dev], check=False).returncode != 0:
                raise RuntimeError(f"no interface {dev!r} on this node")
        self._bpffs()
        self.dir.mkdir(parents=True, exist_ok=True)
        d = self.root / obj.chain
        d.mkdir(parents=True, exist_ok=True)
        name = f"vnf{obj.vnf_id}-a{obj.local_name}"
        pin = str(self.bpffs / f"{self.tag}-att{obj.local_name}")
        # a loader killed hard leaves its filters: clear our slots first
        run([str(native.LOADER), "detach", "--in", obj.in_point, "--out", obj.out_point], check=False)
        label = json.dumps({"chain": obj.chain, "vnf_ns": self.label_ns, "placement": "host"})[1:-1]
        cmd = [str(native.LOADER), "run", "--mode", obj.mode, "--vnf-id", str(obj.vnf_id), "--in", obj.in_point,
               "--out", obj.out_point, "--period-ns", str(obj.period_ns), "--pin", pin, "--label", label,
               "--stats-interval", "1"]
        records, errors = d / f"{name}.jsonl", d / f"{name}.err"
        with open(records, mode="ab") as out, open(errors, mode="wb") as err:
            p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)
        attached = self._wait_attached(records, errors, p)
        st = {"pid": p.pid, "pin": pin, "period_ns": obj.period_ns, "started": time.time(), "attached": attached,
              "records": str(records), "errors": str(errors),
              **{k: getattr(obj, k) for k in LOADER_KEYS}}
        self._save(obj.local_name, st)
        if not attached:
            raise StillLoading(f"pptmon-loader (pid {p.pid}) still loading its programs after {ATTACH_TIMEOUT:g} s")
        return f"attached {obj.mode} at {obj.in_point} / {obj.out_point} (loader pid {p.pid})"

    def _loading(self, name: str, st: dict) -> str:
        """A loader that had not attached when last looked at: attached by now (what it did), still
        loading (StillLoading), or loading for longer than LOAD_LIMIT (killed: RuntimeError)."""
        if _said_attached(Path(st["records"]), st["pid"]):
            st["attached"] = True
            self._save(name, st)
            return (f"attached {st['mode']} at {st['in_point']} / {st['out_point']} (loader pid {st['pid']}, "
                    f"after {time.time() - st['started']:.0f} s)")
        age = time.time() - st["started"]
        if age > LOAD_LIMIT:
            self.remove(name)
            raise RuntimeError(f"pptmon-loader did not attach within {LOAD_LIMIT:g} s")
        raise StillLoading(f"pptmon-loader (pid {st['pid']}) still loading its programs after {age:.0f} s")

    def _died_loading(self, name: str) -> None:
        """A loader that ended before it attached (its state says loading, its process is gone): an
        error with what it said; its state is dropped, so the next resync starts it again."""
        try:
            st = json.loads(self._file(name).read_text())
        except (OSError, ValueError):
            return
        if st.get("attached", True) or _said_attached(Path(st["records"]), st["pid"]):
            return      # it had attached: started again like any loader that died
        self.remove(name)
        try:
            said = Path(st["errors"]).read_text().strip()[:500]
        except (OSError, KeyError):
            said = ""
        raise RuntimeError(f"pptmon-loader exited while loading: {said or 'no message'}")

    def counters(self, objects: list[PptmonAttach]) -> dict[str, dict]:
        """owner key -> the loader's counters (sampled, reported, ...; docs/pptmon.md) of each
        attachment running here, read from its pinned stats map; the report carries them."""
        out = {}
        for obj in objects:
            cur = self._running(obj.local_name)
            if cur is None or not cur.get("attached", True):
                continue
            r = run([str(native.LOADER), "stats", "--pin", cur["pin"]], check=False)
            try:
                counters = json.loads(r.stdout) if r.returncode == 0 else None
            except ValueError:
                counters = None
            if isinstance(counters, dict):
                out[owner_key(obj.owner)] = {k: v for k, v in counters.items() if isinstance(v, int)}
        return out

    def _save(self, name: str, st: dict) -> None:
        tmp = self._file(name).with_suffix(".tmp")
        tmp.write_text(json.dumps(st))
        tmp.replace(self._file(name))

    @staticmethod
    def _wait_attached(records: Path, err: Path, p: subprocess.Popen, timeout: float | None = None) -> bool:
        """True once the loader says it attached, False if it is still loading after `timeout`
        (ATTACH_TIMEOUT); RuntimeError with what it said if it exits first."""
        deadline = time.monotonic() + (ATTACH_TIMEOUT if timeout is None else timeout)
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"pptmon-loader exited: {err.read_text().strip()[:500]}")
            if _said_attached(records, p.pid):
                return True
            time.sleep(0.02)
        return False

    def _bpffs(self) -> None:
        self.bpffs.mkdir(parents=True, exist_ok=True)
        with open("/proc/mounts") as f:
            if any(line.split()[1] == str(self.bpffs) and line.split()[2] == "bpf" for line in f):
                return
        run(["mount", "-t", "bpf", "bpf", str(self.bpffs)])

    def remove(self, name: str) -> None:
        """Stop its loader (which detaches its programs on SIGTERM); clear the slots if it was gone."""
        try:
            st = json.loads(self._file(name).read_text())
        except (OSError, ValueError):
            st = {}
        pid, pin = st.get("pid"), st.get("pin", "")
        if self._is_loader(pid, pin):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 3
            while self._is_loader(pid, pin) and time.monotonic() < deadline:
                time.sleep(0.02)
            if self._is_loader(pid, pin):
                os.kill(pid, signal.SIGKILL)
        if st.get("in_point"):
            run([str(native.LOADER), "detach", "--in", st["in_point"], "--out", st["out_point"]], check=False)
        self._file(name).unlink(missing_ok=True)
        LOG.info("attachment %s: detached", name)


def _said_attached(records: Path, pid: int) -> bool:
    """The loader `pid` wrote its "attached" line into its records file."""
    try:
        with open(records, "rb") as fh:
            return any(b'"attached"' in line and f'"pid":{pid}'.encode() in line for line in fh)
    except OSError:
        return False
