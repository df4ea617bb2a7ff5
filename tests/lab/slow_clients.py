"""Clients for tests/lab/test_slow_clients.py: an attacker holding half-open connections and slow
bodies from one source, and well-behaved clients timing their requests from others.

The attacker runs in its own process (`python -m tests.lab.slow_clients attack ...`, a JSON
summary on stdout at the end): every connection the server closes is opened again at once.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

ROOT = Path(__file__).resolve().parents[2]


async def _attack(host: str, port: int, source: str, half_open: int, slow_bodies: int, token: str | None,
                  seconds: float) -> dict:
    stats = {"connects": 0, "connect_errors": 0, "answers": {}}
    stop = time.monotonic() + seconds
    auth = f"Authorization: Bearer {token}\r\n" if token else ""

    async def slot(kind: str, authorised: bool) -> None:
        while time.monotonic() < stop:
            try:
                reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
            except OSError:
                stats["connect_errors"] += 1
                await asyncio.sleep(0.05)
                continue
            stats["connects"] += 1
            try:
                if kind == "half-open":          # a head never finished
                    writer.write(b"GET /v1/networks HTTP/1.1\r\nHost: x\r\n")
                else:                            # a body announced, then a byte every 5 s
                    writer.write(f"POST /v1/networks HTTP/1.1\r\nHost: x\r\n{auth if authorised else ''}"
                                 "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode())
                reply = b""
                while not reply and time.monotonic() < stop:
                    try:
                        reply = await asyncio.wait_for(reader.read(64), min(5.0, max(stop - time.monotonic(), 0.01)))
                        if not reply:
                            break                # closed by the server
                    except asyncio.TimeoutError:
                        if kind == "slow body":
                            writer.write(b" ")
                if reply:
                    status = reply[9:12].decode(errors="replace")
                    stats["answers"][status] = stats["answers"].get(status, 0) + 1
            except OSError:
                pass
            finally:
                writer.close()

    # the kinds interleaved, so that those the server serves first are of every kind; half of the
    # slow bodies with a valid token
    kinds = _interleaved([("half-open", False)] * half_open, [("slow body", i % 2 == 0) for i in range(slow_bodies)])
    slots = [slot(*k) for k in kinds]
    await asyncio.gather(*slots)
    return stats


def _interleaved(a: list, b: list) -> list:
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out


def start_attack(url: str, source: str, half_open: int, slow_bodies: int, token: str | None, seconds: float,
                 python: str = sys.executable) -> subprocess.Popen:
    return subprocess.Popen([python, "-m", "tests.lab.slow_clients", "attack", url, "--source", source,
                             "--half-open", str(half_open), "--slow-bodies", str(slow_bodies),
                             "--seconds", str(seconds), *(["--token", token] if token else [])],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)


class Client(threading.Thread):
    """`rate` requests per second from `source` for `seconds`: GETs of `paths` in turn, each timed
    (seconds, or None when it failed) with its status."""

    def __init__(self, url: str, source: str, token: str, paths: list[str], rate: float, seconds: float):
        super().__init__(daemon=True)
        self.url, self.source, self.token, self.paths = url, source, token, paths
        self.rate, self.seconds = rate, seconds
        self.results: list[tuple[float | None, int | str]] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=5,
                          transport=httpx.HTTPTransport(local_address=self.source)) as http:
            t0 = time.monotonic()
            for i in range(int(self.rate * self.seconds)):
                time.sleep(max(0.0, t0 + i / self.rate - time.monotonic()))
                start = time.monotonic()
                try:
                    status = http.get(self.paths[i % len(self.paths)]).status_code
                    self.results.append((time.monotonic() - start if status == 200 else None, status))
                except httpx.HTTPError as e:
                    self.results.append((None, type(e).__name__))

    def summary(self) -> dict:
        times = sorted(t for t, _ in self.results if t is not None)
        failed = [s for t, s in self.results if t is None]
        return {"requests": len(self.results), "failed": len(failed),
                "failures": {str(s): failed.count(s) for s in set(failed)},
                "p50_ms": round(1000 * times[len(times) // 2], 1) if times else None,
                "p99_ms": round(1000 * times[min(len(times) - 1, int(len(times) * 0.99))], 1) if times else None,
                "max_ms": round(1000 * times[-1], 1) if times else None}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["attack"])
    p.add_argument("url")
    p.add_argument("--source", required=True)
    p.add_argument("--half-open", type=int, default=1000)
    p.add_argument("--slow-bodies", type=int, default=1000)
    p.add_argument("--token")
    p.add_argument("--seconds", type=float, default=20)
    a = p.parse_args()
    from fathom.api.connections import raise_open_files
    raise_open_files()          # thousands of sockets
    url = urlsplit(a.url)
    print(json.dumps(asyncio.run(_attack(url.hostname, url.port, a.source, a.half_open, a.slow_bodies, a.token,
                                         a.seconds))))


if __name__ == "__main__":
    main()
