"""A trace of actual tables asked of replica A for a node whose agent polls replica B (two apps on
one PostgreSQL store, B served over loopback HTTP): A asks B's desk (`POST /v1/agents/{node}/traces`)
with a token of its own for that node and hop, B's agent answers there, and A gets the output; the
token is gone afterwards; a live trace's requests go the same way. A member's trace crosses replicas as an admin's does; B's route refuses a
member's token and a replica token for another node."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fathom.api.traces import _agents, _live_agents
from fathom.auth import tokens
from fathom.store.auth_models import ApiToken

from .auth import headers_for
from .test_api_races import Served

NODE = "compute1"
FLOW = "in_port=1,dl_src=02:fa:00:00:01:01"


def test_a_hop_whose_agent_polls_another_replica_is_asked_there(postgres):
    url = postgres.new_database(migrated=True)
    b = Served(url)                       # the replica the agent polls
    a = Served(url)                       # the replica asked for the trace
    stop = threading.Event()
    agent = httpx.Client(base_url=b.url, headers=headers_for(b.app, "admin", ("agent",), node=NODE), timeout=10)

    def agent_loop():                     # what the node's agent does with its long-poll's requests
        desk = b.app.state.trace_desk
        while not stop.is_set():
            for ask in desk.take(NODE):
                answer = {"live": {"watched": ["tap1"], "not_watched": [ask["trace"]]}} if "kind" in ask \
                    else {"output": f"traced {ask['bridge']} {ask['flow']}"}
                r = agent.post(f"/agents/{NODE}/traces/{ask['id']}", json=answer)
                assert r.status_code == 204, r.text
            time.sleep(0.02)
    runner = threading.Thread(target=agent_loop, daemon=True)
    runner.start()
    try:
        a.app.state.agent_hub.polls_elsewhere = lambda node: b.url.removesuffix("/v1") if node == NODE else None

        def hop(headers: dict) -> str:
            request = SimpleNamespace(app=a.app, headers={k.lower(): v for k, v in headers.items()})
            return _agents(request, 5.0)(NODE, "br-int", FLOW, ["trk,new"])
        assert hop(a.headers) == f"traced br-int {FLOW}"
        member = headers_for(a.app, "p1", ("member",))
        assert hop(member) == f"traced br-int {FLOW}"         # A checked the member's right to the trace
        # a live trace's request, the same way (beside a node nobody hears)
        request = SimpleNamespace(app=a.app, headers={})
        arm = {"kind": "live-arm", "trace": "t1", "devs": ["tap1"]}
        assert _live_agents(request, 5.0)({NODE: arm, "compute9": arm}) == {
            NODE: {"watched": ["tap1"], "not_watched": ["t1"]},
            "compute9": "node compute9's agent is down or was never heard from"}
        with Session(a.app.state.engine) as s:
            assert s.scalar(select(func.count()).select_from(ApiToken).where(ApiToken.roles == "replica")) == 0
        # B's route itself: a replica's token for this node or an admin's, and bounded as the desk is
        asks = httpx.Client(base_url=b.url, timeout=10)
        body = {"bridge": "br-int", "flow": FLOW, "ct_next": [], "timeout": 1}
        assert asks.post(f"/agents/{NODE}/traces", json=body, headers=member).status_code == 403
        other = tokens.issue_now(b.app.state.engine, project="admin", roles=("replica",), node="compute2")
        assert asks.post(f"/agents/{NODE}/traces", json=body,
                         headers={"Authorization": f"Bearer {other}"}).status_code == 403
        assert asks.post(f"/agents/{NODE}/traces", json={**body, "flow": "in_port=1;rm -rf"},
                         headers=b.headers).status_code == 422
        assert asks.post(f"/agents/{NODE}/traces", json={**body, "bridge": "br-ex"}, headers=b.headers).status_code == 422
        for bad in ({"live": {"kind": "rm"}}, {"live": {"kind": "live-arm", "pad": "0" * 70000}}, {"live": arm, **body},
                    {"bridge": "br-int"}):
            got = asks.post(f"/agents/{NODE}/traces", json={"timeout": 1, **bad}, headers=b.headers)
            assert got.status_code == 422, (bad.keys(), got.text[:200])
        # a replica's role is never issued through the API
        made = asks.post("/tokens", json={"project_id": "admin", "roles": ["replica"], "node": NODE}, headers=b.headers)
        assert made.status_code == 422, made.text
    finally:
        stop.set()
        runner.join(5)
        agent.close()
        a.stop()
        b.stop()
