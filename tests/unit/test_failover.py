"""Clients over several controller endpoints, request ids, and API workers: against a real
controller process (`fathom controller --api-workers 2` on PostgreSQL) and a dead endpoint."""
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from fathom.agent.http import JsonClient
from fathom.auth.tokens import ADMIN_TOKEN_FILE
from fathom.cli.main import cli
from fathom.client import Client, Unreachable
from fathom.lab.controller import free_port


def start_controller(db: str, state: Path, *args: str) -> tuple[subprocess.Popen, str, str]:
    """`fathom controller` on `db` with its state in `state`, once its API answers: (process, url, token)."""
    port = free_port()
    fathom = Path(sys.executable).with_name("fathom")
    proc = subprocess.Popen([str(fathom), "controller", "--insecure", "--db", db, "--api-port", str(port),
                             "--of-port", str(free_port()), "--of-host", "127.0.0.1", "--state-dir", str(state),
                             "--interval", "60", *args], stdout=open(state / "log", "wb"), stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90   # a migrated store and three processes; slow on a busy machine
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, (state / "log").read_text()
        try:
            token = (state / ADMIN_TOKEN_FILE).read_text().strip()
            Client(url, token=token, timeout=1).get("/networks")
            return proc, url, token
        except (OSError, Unreachable):
            time.sleep(0.2)


@pytest.fixture(scope="module")
def controller_process(postgres, tmp_path_factory):
    """A controller with two API processes on a fresh PostgreSQL database: (process, url, token, db url)."""
    db = postgres.new_database()
    proc, url, token = start_controller(db, tmp_path_factory.mktemp("ctl"), "--api-workers", "2")
    yield proc, url, token, db
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def controller(controller_process):
    """(url, token, db url) of controller_process."""
    return controller_process[1:]


def dead() -> str:
    return f"http://127.0.0.1:{free_port()}"   # nothing listens there


def test_the_cli_goes_on_to_the_next_endpoint_and_names_every_one_it_could_not_reach(controller, monkeypatch):
    url, token, _ = controller
    monkeypatch.setenv("FATHOM_TOKEN", token)
    first = dead()
    out = CliRunner().invoke(cli, ["network", "create", "--controller", f"{first},{url}", "--json", "cli-net"])
    assert out.exit_code == 0 and '"cli-net"' in out.output, out.output
    other = dead()
    out = CliRunner().invoke(cli, ["network", "list", "--controller", f"{first},{other}"])
    assert out.exit_code == 1 and first in out.output and other in out.output, out.output


def test_a_write_retried_with_its_request_id_runs_once(controller):
    url, token, db = controller
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex,
               "Connection": "close"}   # a new connection each: either process answers
    body = {"name": "once"}
    with httpx.Client(base_url=url + "/v1", headers=headers, timeout=60) as http:
        answers = [http.post("/networks", json=body) for _ in range(4)]
        assert [a.status_code for a in answers] == [201] * 4
        assert len({a.json()["id"] for a in answers}) == 1
        assert [a.headers.get("Idempotent-Replayed") for a in answers] == [None, "true", "true", "true"]
        with create_engine(db).connect() as c:
            assert c.execute(text("SELECT count(*) FROM networks WHERE name = 'once'")).scalar_one() == 1
        other = http.post("/networks", json={**body, "name": "twice"})
        assert other.status_code == 422 and "different request" in other.text
        for bad in ("", "x" * 65, "a b", "é".encode()):
            r = http.post("/networks", json=body, headers={"Idempotency-Key": bad})
            assert r.status_code == 422 and "Idempotency-Key" in r.text, bad


def test_a_port_creation_retried_with_its_request_id_runs_once(controller):
    """A port's creation records its response with its key in its own transaction and looks the key
    up only when it took none: a repeat (whose binding is now taken by the port it repeats) gets the
    first answer, concurrent repeats too; another body under the key is refused."""
    url, token, db = controller
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url + "/v1", headers=auth, timeout=60) as http:
        node = http.post("/nodes", json={"name": "rid-node", "management_ip": "127.0.0.1", "tunnel_ip": "127.0.0.1"})
        net = http.post("/networks", json={"name": "rid-net"}).json()
        assert node.status_code == 201 and http.post("/subnets", json={"network_id": net["id"], "cidr": "10.77.0.0/24"}).status_code == 201
        body = {"network_id": net["id"], "name": "rid", "node": "rid-node", "interface_name": "rid0"}
        key = {"Idempotency-Key": uuid.uuid4().hex, "Connection": "close"}   # either process answers
        answers = [http.post("/ports", json=body, headers=key) for _ in range(3)]
        assert [a.status_code for a in answers] == [201] * 3
        assert len({a.content for a in answers}) == 1 and answers[0].headers["content-type"] == "application/json"
        assert [a.headers.get("Idempotent-Replayed") for a in answers] == [None, "true", "true"]
        again = {"Idempotency-Key": uuid.uuid4().hex}
        with ThreadPoolExecutor(4) as pool:
            racing = list(pool.map(lambda _: http.post("/ports", json={**body, "name": "rid-race", "interface_name": "rid1"},
                                                        headers={**again, "Connection": "close"}), range(4)))
        assert all(r.status_code in (201, 503) for r in racing), [r.text for r in racing]
        assert len({r.json()["id"] for r in racing if r.status_code == 201}) == 1
        with create_engine(db).connect() as c:
            assert c.execute(text("SELECT count(*) FROM ports WHERE name = 'rid'")).scalar_one() == 1
            assert c.execute(text("SELECT count(*) FROM ports WHERE interface_name = 'rid1'")).scalar_one() == 1
        other = http.post("/ports", json={**body, "name": "rid-other"}, headers=key)
        assert other.status_code == 422 and "different request" in other.text
        taken = http.post("/ports", json=body, headers={"Idempotency-Key": uuid.uuid4().hex})
        assert taken.status_code == 409 and "interface_name" in taken.text


def test_the_client_sends_one_request_id_per_call_and_fails_over(controller):
    url, token, db = controller
    api = Client(f"{dead()},{url}", token=token)
    net = api.post("/networks", json={"name": "via-client"})
    assert api.current == 1 and api.find("networks", "via-client")["id"] == net["id"]
    agent = JsonClient(f"{dead()},{url}", headers={"Authorization": f"Bearer {token}"})
    assert agent.get("/v1/networks", params={"name": "via-client"}).json()[0]["id"] == net["id"]


def test_two_api_workers_answer_concurrent_requests_and_reach_the_controllers_routes(controller):
    url, token, _ = controller

    def one(_):
        with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            return http.get("/health")   # a route of the controller process, from either
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(16)))
    assert {a.status_code for a in answers} == {200}
    assert {a.headers["X-Fathom-Worker"] for a in answers} == {"0", "1"}


def test_api_workers_are_refused_on_sqlite(tmp_path):
    out = CliRunner().invoke(cli, ["controller", "--insecure", "--api-workers", "2", "--db",
                                   f"sqlite:///{tmp_path}/f.db"])
    assert out.exit_code == 2 and "needs a PostgreSQL store" in out.output, out.output


def test_a_write_through_a_worker_wakes_the_controller_process(controller):
    """A network created in either process is decided by the controller's reconciler at once: a
    worker's commit reaches it through the change feed (the periodic pass is far away)."""
    url, token, _ = controller
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        made = {}
        for i in range(12):   # new connections: the kernel spreads them over both processes
            http.headers["Connection"] = "close"
            r = http.post("/networks", json={"name": f"woken-{i}"})
            assert r.status_code == 201, r.text
            made[r.json()["id"]] = r.headers["X-Fathom-Worker"]
        assert "1" in made.values(), made
        for net, worker in made.items():
            r = http.get(f"/networks/{net}", params={"wait": "active", "timeout": 3})
            assert r.json()["status"] == "active", (worker, r.json())

        # a worker's write names its transaction; a long-poll that sends it back is not answered
        # by the status from before that write (the controller process counts it from its feed):
        # an unbound port, `down`, updated (`pending`); each update a worker took waited on at once
        port = http.post("/ports", json={"network_id": next(iter(made))}).json()
        assert http.get(f"/ports/{port['id']}", params={"wait": "down", "timeout": 10}).json()["status"] == "down"
        waits = 0
        for i in range(40):
            r = http.patch(f"/ports/{port['id']}", json={"name": f"renamed-{i}"})
            assert r.status_code == 200, r.text
            if r.headers["X-Fathom-Worker"] != "1":
                continue
            waited = http.get(f"/ports/{port['id']}", params={"wait": "down", "timeout": 10},
                              headers={"X-Fathom-Commit": r.headers["X-Fathom-Commit"]})
            assert waited.json()["status"] == "down", waited.json()
            waits += 1
        assert waits >= 5, waits


def test_the_console_s_event_stream_passes_through_a_worker(controller):
    """/v1/events is the controller process's: a worker passes its server-sent events on as they
    come (a stream that never ends must not wait to be whole)."""
    url, token, _ = controller
    workers = set()
    for _ in range(8):   # new connections: the kernel spreads them over both processes
        with httpx.stream("GET", url + "/v1/events", headers={"Authorization": f"Bearer {token}"},
                          timeout=10) as r:
            assert r.status_code == 200
            workers.add(r.headers["X-Fathom-Worker"])
            first = next(r.iter_lines())
            assert first.startswith("event: hello"), first
        if "1" in workers:
            break
    assert "1" in workers, workers


def test_a_request_still_running_when_the_controller_stops_is_answered_503(controller, tmp_path):
    """SIGTERM: what still runs STOP_GRACE_S later is cut short, and its client is told 503 with
    Retry-After (ask another replica), not 500. Here a network's creation waits on a lock the test
    holds on the table."""
    _, token, db = controller
    proc, url, _ = start_controller(db, tmp_path)     # one more controller on the same store
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex}
    try:
        with create_engine(db).connect() as c, ThreadPoolExecutor(1) as pool:
            c.execute(text("LOCK TABLE networks IN ACCESS EXCLUSIVE MODE"))
            answer = pool.submit(httpx.post, url + "/v1/networks", json={"name": "cut-short"}, headers=headers,
                                 timeout=30)
            time.sleep(1.0)      # the creation is waiting on the lock
            proc.terminate()
            r = answer.result(timeout=20)
            c.rollback()         # the lock freed: the stopping controller's thread ends, and the process
        assert r.status_code == 503 and r.headers["Retry-After"] == "1", (r.status_code, r.text)
        assert "stopping" in r.json()["detail"][0]["msg"]
        proc.wait(20)
    finally:
        proc.kill()


def test_an_agent_leaves_a_controller_that_stopped_within_three_keepalives(controller_process):
    """An agent's long-poll (`keepalive=1`) held through an API worker by the controller process,
    which then stops (SIGSTOP: its kernel keeps the connection up): the agent hears no space for
    three seconds and gives up on it then, not at the poll's timeout; once the process goes on, the
    next poll is answered. The first answer (at once) told the agent that this controller sends them."""
    import os
    import signal
    proc, url, token, _ = controller_process
    admin = Client(url, token=token)
    admin.post("/nodes", json={"name": "kept", "tunnel_ip": "198.18.0.77"})
    node_token = admin.post("/tokens", json={"project_id": "admin", "roles": ["agent"], "node": "kept"})["token"]
    agent = JsonClient(f"{url},{dead()}", headers={"Authorization": f"Bearer {node_token}"})
    rev = agent.get("/v1/agents/kept/desired", params={"keepalive": 1}).json()["revision"]
    got = {}

    def poll():
        t = time.monotonic()
        try:
            got["answer"] = agent.get("/v1/agents/kept/desired", params={"after": rev, "timeout": 50, "keepalive": 1},
                                      timeout=60)
        except ConnectionError as e:
            got["error"] = str(e)
        got["took"] = time.monotonic() - t
    waiting = threading.Thread(target=poll)
    waiting.start()
    time.sleep(2.5)             # the answer streams: a space a second
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        waiting.join(30)
        assert "answer" not in got and "timed out" in got["error"] and url in got["error"], got
        assert 2.5 + 2 < got["took"] < 2.5 + 5, got     # three missed spaces, then the dead endpoint
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    again = agent.get("/v1/agents/kept/desired", params={"after": rev, "timeout": 1.5, "keepalive": 1})
    assert again.status_code == 200 and again.json()["revision"] == rev
