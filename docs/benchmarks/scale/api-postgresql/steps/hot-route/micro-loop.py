"""The event loop's CPU a port creation, without HTTP: the controller's ASGI app as `fathom
controller` wraps it (DateHeader, CutShort, Gate over create_app, on PostgreSQL with its defaults),
called in-process on uvloop by CONC concurrent tasks each sending `POST /v1/ports` (a bearer token,
an Idempotency-Key, the bench's body); the event loop thread's CPU (time.thread_time) and the
process's a creation, over blocks of N creations after a warm-up. Run from the repository
(PYTHONPATH=<tree> for another tree; PREFIX names the PostgreSQL directories fathom-pg-PREFIX-*):
    python micro-loop.py N BLOCKS [CONC]"""
import asyncio, json, os, sys, tempfile, time, uuid
from pathlib import Path

import uvloop

import fathom.bench.postgres as pgmod
from fathom.api import create_app
from fathom.api.connections import ConnectionLimits, Gate, Guard
from fathom.auth.tokens import ensure_admin_token
from fathom.controller.server import CutShort, DateHeader
from fathom.store.db import open_store

n, blocks = int(sys.argv[1]), int(sys.argv[2])
conc = int(sys.argv[3]) if len(sys.argv) > 3 else 8
PREFIX = os.environ.get("PREFIX", "x7")
pgmod.PREFIX = f"fathom-pg-{PREFIX}-"
pg = pgmod.PostgresServer(durable=True).start()
try:
    engine = open_store(pg.new_database())
    token = ensure_admin_token(engine, Path(tempfile.mkdtemp(prefix=f"{PREFIX}-micro-"))).read_text().strip()
    api = create_app(engine)
    app = DateHeader(CutShort(Gate(api, Guard(ConnectionLimits()))))

    async def call(method, path, body=None, key=True):
        raw = b"" if body is None else json.dumps(body).encode()
        headers = [(b"host", b"127.0.0.1:9696"), (b"authorization", f"Bearer {token}".encode()),
                   (b"accept", b"application/json"), (b"content-type", b"application/json"),
                   (b"content-length", str(len(raw)).encode())]
        if key:
            headers.append((b"idempotency-key", uuid.uuid4().hex.encode()))
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "server": ("127.0.0.1", 9696), "client": ("127.0.0.1", 40000), "scheme": "http",
                 "method": method, "root_path": "", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "headers": headers, "state": {}}
        sent = False
        out = []

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await asyncio.sleep(3600)

        async def send(message):
            out.append(message)
        await app(scope, receive, send)
        status = out[0]["status"]
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {out[1].get('body')}")
        return json.loads(out[1]["body"]) if out[1].get("body") else None

    async def main():
        node = await call("POST", "/v1/nodes", {"name": "n1", "management_ip": "127.0.0.1", "tunnel_ip": "127.0.0.1"})
        net = await call("POST", "/v1/networks", {"name": "net", "type": "vxlan"})
        await call("POST", "/v1/subnets", {"network_id": net["id"], "cidr": "10.100.0.0/16"})
        counter = iter(range(10**9))

        async def writer(k):
            for _ in range(k):
                i = next(counter)
                await call("POST", "/v1/ports", {"network_id": net["id"], "name": f"p{i}", "node": node["name"],
                                                 "interface_name": f"if{i}"})
        await asyncio.gather(*(writer(200 // conc) for _ in range(conc)))   # warm
        loop_cpu = proc_cpu = done = 0.0
        for _ in range(blocks):
            t0, p0 = time.thread_time(), time.process_time()
            await asyncio.gather(*(writer(n // conc) for _ in range(conc)))
            loop_cpu += time.thread_time() - t0
            proc_cpu += time.process_time() - p0
            done += conc * (n // conc)
        print(f"{os.environ.get('LABEL', '')} event loop {1e6 * loop_cpu / done:.0f} us, process {1e6 * proc_cpu / done:.0f} us "
              f"a creation ({done:.0f}; load {os.getloadavg()[0]:.1f})")
    uvloop.run(main())
finally:
    pg.stop()
