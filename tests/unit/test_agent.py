"""`fathom agent`: following the loaders' files (partial lines, truncation, rotation, restarts) and
delivering over real HTTP (uvicorn on loopback serving the controller's API over a SQLite store)
with retries, backoff and a bounded buffer."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest
import uvicorn
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fathom.agent.agent import Agent
from fathom.agent.tail import Follower
from fathom.api import create_app
from fathom.lab.controller import free_port
from fathom.store.pptmon_models import PptmonRecord

from .auth import headers_for
from .pptmon_records import record

_AGENT_HEADERS: dict[str, dict] = {}


def agent_headers(tmp_path) -> dict:
    """The agent token of node n1 in the store the test's Server uses (issued before the server
    starts when the agent comes first)."""
    db = str(tmp_path / "ctl.db")
    if db not in _AGENT_HEADERS:
        from fathom.auth.client import bearer
        from fathom.auth.tokens import issue_now
        from fathom.store.db import open_store
        engine = open_store(f"sqlite:///{db}")
        _AGENT_HEADERS[db] = bearer(issue_now(engine, project="admin", roles=["agent"], node="n1"))
        engine.dispose()
    return _AGENT_HEADERS[db]


class Server:
    """The controller's API (create_app) under uvicorn on 127.0.0.1, in a thread; restartable on
    the same port. `fail_next` answers that many requests with 503; `refuse` (a set of batch
    indices) answers the next batch with a 422 naming them, as the real validation would."""

    def __init__(self, tmp_path, port=None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(f"sqlite:///{tmp_path / 'ctl.db'}")
        self.admin = headers_for(self.app)
        self.fail_next = 0
        self.refuse: set[int] = set()
        self.requests = 0
        self.server = self.thread = None

    async def asgi(self, scope, receive, send):
        if scope["type"] == "http":
            self.requests += 1
            if self.fail_next > 0 or self.refuse:
                status, body = 503, {"detail": "injected"}
                if self.fail_next > 0:
                    self.fail_next -= 1
                else:
                    status, body = 422, {"detail": [{"loc": ["body", "records", i, "seq"], "msg": "injected",
                                                     "type": "invalid"} for i in sorted(self.refuse)]}
                    self.refuse = set()
                while (await receive()).get("more_body"):
                    pass
                data = json.dumps(body).encode()
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": data})
                return
        await self.app(scope, receive, send)

    def start(self):
        cfg = uvicorn.Config(self.asgi, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off",
                             interface="asgi3")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def stop(self):
        if self.server:
            self.server.should_exit = True
            self.thread.join(timeout=10)
            self.server = None

    def count(self, **where) -> int:
        with Session(self.app.state.engine) as s:
            return s.scalar(select(func.count()).select_from(PptmonRecord).filter_by(**where))

    def seqs(self) -> list[int]:
        with Session(self.app.state.engine) as s:
            return sorted(s.scalars(select(PptmonRecord.seq)))


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path).start()
    yield s
    s.stop()
    s.app.state.engine.dispose()


class Files:
    """A fake loader output directory: <root>/<chain>/vnf<k>.jsonl, written line by line."""

    def __init__(self, root, chain="pa1"):
        self.dir = root / chain
        self.dir.mkdir(parents=True, exist_ok=True)
        self.chain = chain
        self.path = self.dir / "vnf2.jsonl"
        self.n = 0

    def lines(self, count: int, start: int | None = None) -> bytes:
        out = []
        for i in range(self.n if start is None else start, (self.n if start is None else start) + count):
            out.append(json.dumps(record(i, chain=self.chain)))
        if start is None:
            self.n += count
        return ("\n".join(out) + "\n").encode()

    def write(self, data: bytes, path=None):
        with open(path or self.path, "ab") as f:
            f.write(data)

    def attached(self):
        self.write(json.dumps({"type": "attached", "chain": self.chain, "pid": os.getpid(),
                               "t": time.time_ns()}).encode() + b"\n")


def run_agent(a: Agent):
    t = threading.Thread(target=a.run, daemon=True)
    t.start()
    return t


def wait(cond, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def agent(url, tmp_path, **kw) -> Agent:
    opts = dict(root=tmp_path / "run", state_dir=tmp_path / "state", node="n1", batch=50, buffer=1000,
                poll=0.02, flush=0.1, backoff_min=0.05, backoff_max=0.4, log_interval=0, grace=0.5, timeout=5)
    opts.update(kw)
    return Agent(url, headers=agent_headers(tmp_path), **opts)


# ---------------------------------------------------------------------------------------------- tailing alone


def test_partial_lines_are_held_until_complete(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b"")
    f = Follower([str(p)])
    f.scan()
    for piece, want in ((b'{"a": 1}\n{"b"', [b'{"a": 1}']), (b": 2", []), (b"}\n", [b'{"b": 2}']),
                        (b"\n", [b""]), (b"x" * 10, [])):
        with open(p, "ab") as fh:
            fh.write(piece)
        f.read(100)
        lines = f.pull(100)
        assert [x.data for x in lines] == want
        for x in lines:
            f.done(x)
    (t,) = f.current.values()
    assert t.committed == 9 + 9 + 1      # the unfinished "xxxxxxxxxx" is not dealt with
    assert f.checkpoint()[str(p)]["offset"] == 19


def test_outstanding_lines_hold_the_checkpoint(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b"one\ntwo\nthree\n")
    f = Follower([str(p)])
    f.scan()
    f.read(100)
    a, b, c = f.pull(100)
    f.done(a)
    assert f.checkpoint()[str(p)]["offset"] == 4     # "two" is still outstanding
    f.done(b)
    f.done(c)
    assert f.checkpoint()[str(p)]["offset"] == 14


def take(f: Follower) -> list[bytes]:
    lines = f.pull(100)
    for x in lines:
        f.done(x)
    return [x.data for x in lines]


def test_truncation_and_rotation(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b"a1\na2\n")
    f = Follower([str(p)], grace=0.2)
    f.scan()
    f.read(100)
    assert take(f) == [b"a1", b"a2"]
    # copytruncate: same inode, starts again
    with open(p, "r+b") as fh:
        fh.truncate(0)
    p.write_bytes(b"b1\n")
    f.scan()
    f.read(100)
    assert take(f) == [b"b1"] and f.counters["truncations"] == 1
    # copytruncate and rewritten beyond our position before we looked again
    with open(p, "r+b") as fh:
        fh.truncate(0)
    p.write_bytes(b"B1-longer-than-before\n")
    f.read(100)
    assert take(f) == [b"B1-longer-than-before"] and f.counters["truncations"] == 2
    # rename rotation; the writer still holds the old inode and finishes a line there
    old = open(p, "ab")
    old.write(b"b2\nb3-par")
    old.flush()
    os.rename(p, tmp_path / "f.jsonl.1")
    p.write_bytes(b"c1\n")
    f.scan()
    old.write(b"tial\n")
    old.close()
    f.read(100)
    got = take(f)
    assert got == [b"b2", b"b3-partial", b"c1"], got          # old inode first, then the new file
    assert f.counters["rotations"] == 1 and len(f.orphans) == 1 and f.counters["truncations"] == 2
    time.sleep(0.3)
    f.read(100)
    assert f.orphans == []                                    # drained and idle: closed
    # deletion: the file's remaining lines are still read
    with open(p, "ab") as fh:
        fh.write(b"c2\n")
    os.unlink(p)
    f.scan()
    f.read(100)
    assert take(f) == [b"c2"]


def test_resume_only_on_the_same_file(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_bytes(b'{"type":"attached","pid":1}\nr1\nr2\n')
    f = Follower([str(p)])
    f.scan()
    f.read(100)
    for x in f.pull(2):
        f.done(x)
    cp = f.checkpoint()
    f.close()
    with open(p, "ab") as fh:
        fh.write(b"r3\n")
    g = Follower([str(p)], resume=cp)
    g.scan()
    g.read(100)
    assert [x.data for x in g.pull(100)] == [b"r2", b"r3"]
    g.close()
    # same path, same inode number possible (tmpfs reuses them), different first line: from 0
    p.write_bytes(b'{"type":"attached","pid":2}\nq1\nq2\n')
    cp[str(p)]["ino"] = os.stat(p).st_ino
    h = Follower([str(p)], resume=cp)
    h.scan()
    h.read(100)
    assert [x.data for x in h.pull(100)][1:] == [b"q1", b"q2"]


# ---------------------------------------------------------------------------------------------- delivery over HTTP


def test_delivers_records_written_in_pieces(server, tmp_path):
    files = Files(tmp_path / "run")
    files.attached()
    a = agent(server.url, tmp_path)
    t = run_agent(a)
    try:
        for _ in range(5):
            data = files.lines(40)
            cut = len(data) // 2 + 7                        # split in the middle of a line
            files.write(data[:cut])
            time.sleep(0.05)
            files.write(data[cut:])
            files.write(b'{"type":"stats","counters":{}}\nnot json\n')
            bad = record(9999, chain="pa1")
            bad["e2e_us"] = 1
            files.write(json.dumps(bad).encode() + b"\n")
        wait(lambda: server.count() == 200, what="200 records")
    finally:
        a.stop()
        t.join(10)
    assert server.seqs() == list(range(200))
    assert a.c["delivered"] == 200 and a.c["duplicates"] == 0
    assert a.c["not_json"] == 5 and a.c["invalid"] == 5 and a.c["skipped_lines"] == 6
    st = json.loads((tmp_path / "state" / "status.json").read_text())
    assert st["counters"]["delivered"] == 200 and st["buffered"] == 0 and "stopped" in st


def test_rotation_and_truncation_while_delivering(server, tmp_path):
    files = Files(tmp_path / "run")
    a = agent(server.url, tmp_path, grace=0.3)
    t = run_agent(a)
    try:
        files.attached()
        files.write(files.lines(30))
        wait(lambda: server.count() == 30, what="first 30")
        writer = open(files.path, "ab")                       # the loader keeps its descriptor
        os.rename(files.path, files.path.with_name("vnf2.jsonl.1"))
        files.attached()
        files.write(files.lines(30))                          # new file
        writer.write(files.lines(20))                         # late lines into the rotated one
        writer.close()
        wait(lambda: server.count() == 80, what="80 after rotation")
        # copytruncate of the new file after everything was delivered
        with open(files.path, "r+b") as fh:
            fh.truncate(0)
        files.write(files.lines(25))
        wait(lambda: server.count() == 105, what="105 after truncation")
    finally:
        a.stop()
        t.join(10)
    assert server.seqs() == list(range(105))
    assert a.c["duplicates"] == 0 and a.follower.counters["rotations"] == 1
    assert a.follower.counters["truncations"] == 1


def test_restart_resumes_without_duplicates(server, tmp_path):
    files = Files(tmp_path / "run")
    files.attached()
    files.write(files.lines(60))
    a = agent(server.url, tmp_path)
    t = run_agent(a)
    wait(lambda: server.count() == 60, what="60")
    a.stop()
    t.join(10)
    files.write(files.lines(40))
    files.write(b'{"type":"ppt","chain":"pa1","half')          # the writer is mid-line
    b = agent(server.url, tmp_path)
    t = run_agent(b)
    try:
        wait(lambda: server.count() == 100, what="100")
        time.sleep(0.3)
    finally:
        b.stop()
        t.join(10)
    assert b.c["delivered"] == 40 and b.c["duplicates"] == 0 and b.c["records_read"] == 40
    assert server.seqs() == list(range(100))


def test_one_agent_per_state_directory(server, tmp_path):
    from fathom.agent.agent import AgentError
    a = agent(server.url, tmp_path)
    t = run_agent(a)
    try:
        wait(lambda: (tmp_path / "state" / "status.json").exists(), what="the first agent")
        with pytest.raises(AgentError, match=f"pid {os.getpid()}"):
            agent(server.url, tmp_path).run()
    finally:
        a.stop()
        t.join(10)
    b = agent(server.url, tmp_path)       # free again
    b.stop()
    b.run()


def test_controller_down_then_up_backoff_and_no_loss(tmp_path):
    port = free_port()
    files = Files(tmp_path / "run")
    files.attached()
    files.write(files.lines(120))
    a = agent(f"http://127.0.0.1:{port}", tmp_path)
    t = run_agent(a)
    srv = None
    try:
        wait(lambda: a.failures >= 3, what="failures")
        st = a.status()
        assert st["buffered"] == 120 and st["last_error"] and st["consecutive_failures"] >= 3
        assert a.c["batches_failed"] >= 3
        srv = Server(tmp_path, port=port).start()
        srv.fail_next = 2                                    # and then two 503s
        wait(lambda: srv.count() == 120, timeout=15, what="delivery after the controller came up")
    finally:
        a.stop()
        t.join(10)
        if srv:
            srv.stop()
            srv.app.state.engine.dispose()
    assert a.failures == 0 and a.c["delivered"] == 120 and a.c["dropped_overflow"] == 0


def test_bounded_buffer_pause_then_drop_oldest(tmp_path):
    port = free_port()
    files = Files(tmp_path / "run")
    files.attached()
    files.write(files.lines(100))
    a = agent(f"http://127.0.0.1:{port}", tmp_path, buffer=20, batch=10)
    for _ in range(20):
        a.step()
    assert len(a.buffer) == 20 and a.c["dropped_overflow"] == 0 and a.follower.lag_bytes() > 0
    a.follower.close()
    b = agent(f"http://127.0.0.1:{port}", tmp_path, buffer=20, batch=10, overflow="drop-oldest",
              state_dir=tmp_path / "state2")
    for _ in range(20):
        b.step()
    assert len(b.buffer) == 20 and b.c["dropped_overflow"] == 80
    assert [o["seq"] for _, o in b.buffer] == list(range(80, 100))   # the newest kept
    srv = Server(tmp_path, port=port).start()
    try:
        b.next_attempt = 0
        wait(lambda: (b.step() or True) and srv.count() == 20, what="the kept 20")
        b.follower.close()
        a.follower = Follower(a.follower.patterns, resume=a._load_checkpoint())
        # the paused agent loses nothing: everything arrives once it can deliver
        a.next_attempt = 0
        wait(lambda: (a.step() or True) and srv.count() == 100, what="all 100")
    finally:
        srv.stop()
        srv.app.state.engine.dispose()


def test_refused_records_are_counted_and_the_rest_delivered(server, tmp_path):
    files = Files(tmp_path / "run")
    files.attached()
    files.write(files.lines(10))
    server.refuse = {1, 4}
    a = agent(server.url, tmp_path)
    t = run_agent(a)
    try:
        # the agent's count too: a delivery whose answer came too late (a loaded machine) is
        # delivered again, and counted when it is answered
        wait(lambda: server.count() == 8 and a.c["delivered"] == 8, what="8 records, counted by the agent")
    finally:
        a.stop()
        t.join(10)
    assert a.c["rejected"] == 2 and a.c["delivered"] == 8
    assert server.seqs() == [0, 2, 3, 5, 6, 7, 8, 9]


def test_a_batch_refused_as_a_whole_is_counted_not_retried_forever(server, tmp_path):
    files = Files(tmp_path / "run")
    files.attached()
    files.write(files.lines(5))
    a = agent(server.url, tmp_path)
    a.http.headers.update(server.admin)             # not an agent token, 403: retried (the operator fixes it)
    for _ in range(5):
        a.step()
        time.sleep(0.05)
    assert a.failures >= 1 and "403" in a.last_error and len(a.buffer) == 5 and a.c["rejected"] == 0
    a.http.headers.update(agent_headers(tmp_path))
    a.node = "x" * 65                             # a 422 about the batch, not a record
    a.next_attempt = 0
    a.step()
    assert a.c["rejected"] == 5 and not a.buffer and server.count() == 0
    assert a.follower.checkpoint()[str(files.path)]["offset"] == files.path.stat().st_size


def token_env(server) -> dict:
    return {"FATHOM_TOKEN": server.admin["Authorization"].split()[1]}


def test_stats_command_asks_the_controller(server, tmp_path):
    from click.testing import CliRunner

    from fathom.cli.main import cli
    files = Files(tmp_path / "run", chain="pacli")
    files.attached()
    files.write(files.lines(30))
    a = agent(server.url, tmp_path)
    t = run_agent(a)
    try:
        wait(lambda: server.count() == 30, what="30")
    finally:
        a.stop()
        t.join(10)
    r = CliRunner().invoke(cli, ["pptmon", "stats", "pacli", "--controller", server.url, "--json"], env=token_env(server))
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["records"] == 30 and set(s["vnfs"]) == {"1", "2"} and s["e2e"]["p50_us"] == 7
    r = CliRunner().invoke(cli, ["pptmon", "stats", "pacli", "--controller", server.url, "--since", "1h"], env=token_env(server))
    assert r.exit_code == 0, r.output
    assert "vnf1" in r.output and "vnf2" in r.output and "end-to-end" in r.output and "30 records" in r.output
    r = CliRunner().invoke(cli, ["pptmon", "stats", "pacli", "--controller", "http://127.0.0.1:9"], env=token_env(server))
    assert r.exit_code != 0
    r = CliRunner().invoke(cli, ["pptmon", "records", "pacli", "--controller", server.url, "--last", "3",
                                 "--vnf", "2", "--since", "1h"], env=token_env(server))
    assert r.exit_code == 0, r.output
    assert [json.loads(x)["seq"] for x in r.output.splitlines()] == [27, 28, 29]
    # one reporting node's records: the agent's (n1), and none of another node's
    for node, n in (("n1", 30), ("n2", 0)):
        r = CliRunner().invoke(cli, ["pptmon", "stats", "pacli", "--controller", server.url, "--node", node, "--json"],
                               env=token_env(server))
        assert r.exit_code == 0 and json.loads(r.output)["records"] == n, r.output
        r = CliRunner().invoke(cli, ["pptmon", "records", "pacli", "--controller", server.url, "--node", node],
                               env=token_env(server))
        assert r.exit_code == 0 and len(r.output.splitlines()) == min(n, 20), r.output
