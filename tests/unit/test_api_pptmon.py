"""PPTMon records in the controller: ingestion (validation, idempotency), query, stats, retention
and the Prometheus histograms — on SQLite and on a real PostgreSQL (as tests/unit/test_api.py)."""
from __future__ import annotations

import threading
import time
import warnings

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fathom.api import pptmon as papi
from fathom.pptmon.stats import chain_stats
from fathom.stats import percentile
from fathom.store.pptmon_models import PptmonRecord

from .pptmon_records import record

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

from .auth import headers_for  # noqa: E402




@pytest.fixture
def app(db_url):
    a = create_app(db_url)
    yield a
    a.state.engine.dispose()


@pytest.fixture
def http(app):
    return TestClient(app, headers=headers_for(app))


def agent_of(app, node="n1") -> dict:
    """Headers with the agent token of `node` (one per app and node)."""
    tokens = app.state.__dict__.setdefault("test_agents", {})
    if node not in tokens:
        tokens[node] = headers_for(app, "admin", ("agent",), node=node)
    return tokens[node]


def post(http, records, node="n1", status=200):
    r = http.post("/v1/pptmon/records", json={"node": node, "records": records}, headers=agent_of(http.app, node))
    assert r.status_code == status, r.text
    return r.json()


def count(app, **where) -> int:
    with Session(app.state.engine) as s:
        return s.scalar(select(func.count()).select_from(PptmonRecord).filter_by(**where))


def uniq(prefix: str) -> str:
    return f"{prefix}{time.monotonic_ns() % 10**9}"


def sample(name, labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


# ---------------------------------------------------------------------------------------------- ingestion


def test_ingest_and_query_round_trip(app, http):
    recs = [record(i, hops=(i, 2 * i)) for i in range(1, 6)]
    assert post(http, recs) == {"received": 5, "accepted": 5, "duplicates": 0}
    got = http.get("/v1/pptmon/records", params={"chain": "pa1"}).json()
    assert len(got) == 5
    for want, have in zip(recs, got):
        for k in ("chain", "vnf_ns", "ktime_ns", "time_ns", "seq", "hops", "e2e_us", "flow"):
            assert have[k] == want[k], k
        assert have["node"] == "n1" and len(have["key"]) == 32
    assert count(app) == 5


def test_retried_batch_is_stored_and_counted_once(app, http):
    chain = uniq("paidem")
    batch = [record(i, chain=chain) for i in range(20)]
    h = ("fathom_pptmon_vnf_processing_seconds_count", {"chain": chain, "node": "n1", "vnf": "1"})
    assert post(http, batch)["accepted"] == 20
    assert post(http, batch) == {"received": 20, "accepted": 0, "duplicates": 20}
    # overlapping batch, and a record repeated inside one batch
    more = batch[10:] + [record(i, chain=chain) for i in range(20, 25)] + [record(24, chain=chain)]
    assert post(http, more) == {"received": 16, "accepted": 5, "duplicates": 11}
    assert count(app, chain=chain) == 25
    assert sample(*h) == 25           # the histogram saw each record once
    assert sample("fathom_pptmon_records_duplicate_total", {"chain": chain, "node": "n1"}) == 31


def test_concurrent_identical_batches(app, http):
    """An agent retrying while its first attempt is still being processed."""
    batch = [record(i, chain="paconc") for i in range(200)]
    results, errors = [], []

    def go():
        try:
            results.append(post(TestClient(app, headers=headers_for(app)), batch))
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(r["accepted"] for r in results) == 200
    assert count(app, chain="paconc") == 200


@pytest.mark.parametrize("field,value,loc", [
    ("chain", "", ["records", 1, "chain"]),
    ("chain", "bad name!", ["records", 1, "chain"]),
    ("seq", 70000, ["records", 1, "seq"]),
    ("hops", [], ["records", 1, "hops"]),
    ("hops", [{"vnf": 1, "ppt_us": 1 << 24}], ["records", 1, "hops", 0, "ppt_us"]),
    ("hops", [{"vnf": 300, "ppt_us": 1}], ["records", 1, "hops", 0, "vnf"]),
    ("e2e_us", 99, ["records", 1]),
    ("time_ns", "yesterday", ["records", 1, "time_ns"]),
    ("flow", {"family": 5}, ["records", 1, "flow", "family"]),
    ("v", 2, ["records", 1, "v"]),
])
def test_field_level_422_and_nothing_stored(app, http, field, value, loc):
    bad = record(2)
    bad[field] = value
    r = http.post("/v1/pptmon/records", json={"node": "n1", "records": [record(1), bad]}, headers=agent_of(app))
    assert r.status_code == 422, r.text
    locs = [d["loc"][1:] for d in r.json()["detail"]]
    assert any(x[:len(loc)] == loc for x in locs), locs
    assert count(app) == 0            # the batch is all or nothing


def test_batch_limits_and_who_may_deliver(app, http):
    agent = agent_of(app)
    r = http.post("/v1/pptmon/records", json={"node": "n1", "records": [record(i) for i in range(1001)]},
                  headers=agent)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "records"]
    r = http.post("/v1/pptmon/records", json={"node": "n1", "records": [], "bogus": 1}, headers=agent)
    assert r.status_code == 422
    assert post(http, []) == {"received": 0, "accepted": 0, "duplicates": 0}
    member = headers_for(app, "p1", ("member",))
    one = {"node": "n1", "records": [record(1)]}
    assert http.post("/v1/pptmon/records", json=one, headers=member).status_code == 403
    assert http.get("/v1/pptmon/records", headers=member).status_code == 403
    assert http.post("/v1/pptmon/records", json=one).status_code == 403            # an admin is no agent
    r = http.post("/v1/pptmon/records", json=one, headers=agent_of(app, "n2"))     # another node's agent
    assert r.status_code == 403 and r.json()["detail"][0]["loc"] == ["body", "node"]
    assert TestClient(app).post("/v1/pptmon/records", json=one).status_code == 401   # no token
    assert count(app) == 0


# ---------------------------------------------------------------------------------------------- query


def test_query_filters(http):
    now = time.time_ns()
    # one record every 10 s: the time-window checks keep seconds of margin on a loaded machine
    post(http, [record(i, chain="paq", t_ns=now - (100 - i) * 10**10) for i in range(100)]
         + [record(1000 + i, hops=(1,), chain="paq", vnf_ns="paq-x", t_ns=now) for i in range(3)]
         + [record(i, chain="paother", t_ns=now) for i in range(7)])
    get = lambda **p: http.get("/v1/pptmon/records", params=p)   # noqa: E731
    assert len(get(chain="paq", limit=1000).json()) == 103
    assert len(get(chain="paother").json()) == 7
    assert len(get(chain="paq", vnf=2, limit=1000).json()) == 100   # 3 records only went through VNF 1
    assert len(get(chain="paq", vnf=1, limit=1000).json()) == 103
    last = get(chain="paq", limit=5, vnf=2).json()                  # the newest 5, oldest first
    assert [r["seq"] for r in last] == [95, 96, 97, 98, 99]
    assert len(get(chain="paq", since="105s", vnf=2).json()) == 10
    assert len(get(chain="paq", since=str(now - 500 * 10**9 - 1), vnf=2, limit=1000).json()) == 50
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((now - 205 * 10**9) / 1e9)) + "Z"
    assert len(get(chain="paq", since=iso, vnf=2).json()) in (20, 21)  # whole seconds
    for bad, where in (({"since": "soon"}, "since"), ({"limit": 0}, "limit"), ({"vnf": 256}, "vnf")):
        r = get(**bad)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", where], r.text
    chains = {c["chain"]: c for c in http.get("/v1/pptmon/chains").json()}
    assert chains["paq"]["records"] == 103 and chains["paq"]["nodes"] == ["n1"]


# ---------------------------------------------------------------------------------------------- stats


def test_stats_maths(http):
    """Per-VNF and end-to-end percentiles over a window equal the local (reference) computation."""
    now = time.time_ns()
    recs = [record(i, hops=(1 + i % 10, 100 + (i * 7) % 50), chain="pas", t_ns=now - i * 10**8)
            for i in range(1000)]
    recs.append(record(5000, hops=(5, None), chain="pas", t_ns=now))      # unknown hop: no e2e
    post(http, recs[:500])
    post(http, recs[500:])
    s = http.get("/v1/pptmon/stats", params={"chain": "pas", "window": "1h"}).json()
    ref = chain_stats(recs)
    assert s["records"] == 1001 and s["incomplete"] == 1
    assert set(s["vnfs"]) == {"1", "2"}
    for k in (1, 2):
        for q in ("count", "min_us", "p50_us", "p90_us", "p99_us", "max_us"):
            assert s["vnfs"][str(k)][q] == pytest.approx(ref["vnfs"][k][q]), (k, q)
    assert s["e2e"]["p99_us"] == pytest.approx(ref["e2e"]["p99_us"])
    vnf1 = sorted(1 + i % 10 for i in range(1000)) + [5]
    assert s["vnfs"]["1"]["p50_us"] == percentile(sorted(vnf1), 50)
    assert s["vnfs"]["1"]["p90_us"] == percentile(sorted(vnf1), 90)
    # a window: records of the last 10.05 s only (i = 0..100, plus the incomplete one)
    w = http.get("/v1/pptmon/stats", params={"chain": "pas", "since": str(now - 10 * 10**9)}).json()
    assert w["records"] == 102 and w["vnfs"]["1"]["count"] == 102 and w["vnfs"]["2"]["count"] == 101
    assert w["e2e"]["count"] == 101
    empty = http.get("/v1/pptmon/stats", params={"chain": "nope"}).json()
    assert empty["records"] == 0 and empty["vnfs"] == {} and empty["e2e"] == {"count": 0}
    r = http.get("/v1/pptmon/stats", params={"chain": "pas", "since": "1m", "window": "1m"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "window"]


def test_histograms_on_the_registry(http):
    from prometheus_client import generate_latest
    ch = uniq("pah")   # metrics are per process: a chain of this test only
    post(http, [record(i, hops=(3, 40), chain=ch) for i in range(10)])
    assert sample("fathom_pptmon_vnf_processing_seconds_bucket",
                  {"chain": ch, "node": "n1", "vnf": "1", "le": "5e-06"}) == 10
    assert sample("fathom_pptmon_vnf_processing_seconds_bucket",
                  {"chain": ch, "node": "n1", "vnf": "2", "le": "2e-05"}) == 0
    assert sample("fathom_pptmon_vnf_processing_seconds_bucket",
                  {"chain": ch, "node": "n1", "vnf": "2", "le": "5e-05"}) == 10
    assert sample("fathom_pptmon_chain_processing_seconds_sum", {"chain": ch, "node": "n1"}) == pytest.approx(430e-6)
    assert sample("fathom_pptmon_records_ingested_total", {"chain": ch, "node": "n1"}) == 10
    text = generate_latest(REGISTRY).decode()
    assert f'fathom_pptmon_chain_processing_seconds_count{{chain="{ch}",node="n1"}} 10.0' in text


# ---------------------------------------------------------------------------------------------- retention


def test_retention_by_age_and_count(app, http):
    now = time.time_ns()
    post(http, [record(i, chain="paret", t_ns=now - i * 3600 * 10**9) for i in range(48)])   # 2 days, hourly
    engine = app.state.engine
    out = papi.enforce_retention(engine, papi.RetentionConfig(max_age_s=24 * 3600 - 1, max_records=0))
    assert out == {"age": 24, "count": 0} and count(app) == 24
    post(http, [record(100 + i, chain="paret", t_ns=now) for i in range(30)])
    # count: the newest arrivals stay
    out = papi.enforce_retention(engine, papi.RetentionConfig(max_age_s=0, max_records=40))
    assert out == {"age": 0, "count": 14} and count(app) == 40
    assert count(app, seq=129) == 1 and count(app, seq=14) == 1 and count(app, seq=13) == 0
    # nothing more to do
    assert papi.enforce_retention(engine, papi.RetentionConfig(max_age_s=86400, max_records=40)) == \
        {"age": 0, "count": 0}
    # chunks: more than one delete round
    old = papi.DELETE_CHUNK
    papi.DELETE_CHUNK = 7
    try:
        assert papi.enforce_retention(engine, papi.RetentionConfig(max_age_s=0, max_records=5))["count"] == 35
    finally:
        papi.DELETE_CHUNK = old
    assert count(app) == 5


def test_retention_runs_periodically_while_served(db_url, monkeypatch):
    """The worker starts with the app's lifespan (as under uvicorn) and follows the environment."""
    monkeypatch.setenv("FATHOM_PPTMON_RETENTION", "1h")
    monkeypatch.setenv("FATHOM_PPTMON_MAX_RECORDS", "0")
    monkeypatch.setenv("FATHOM_PPTMON_RETENTION_INTERVAL", "200ms")
    app = create_app(db_url)
    try:
        with TestClient(app, headers=headers_for(app)) as http:      # runs the lifespan
            now = time.time_ns()
            post(http, [record(i, chain="paper", t_ns=now - i * 600 * 10**9) for i in range(12)])
            deadline = time.monotonic() + 5
            while count(app) != 6 and time.monotonic() < deadline:   # older than 1 h: i >= 6
                time.sleep(0.1)
            assert count(app) == 6
            r = http.post("/v1/pptmon/retention").json()
            assert r["max_age_s"] == 3600 and r["interval_s"] == 0.2 and r["removed"] == {"age": 0, "count": 0}
    finally:
        app.state.engine.dispose()


def test_duration_and_since_parsing():
    from fathom.pptmon.records import parse_duration
    assert parse_duration("7d") == 7 * 86400 and parse_duration("250ms") == 0.25 and parse_duration("90") == 90
    with pytest.raises(ValueError):
        parse_duration("a week")
    assert papi.parse_since("2026-01-01T00:00:00Z") == 1767225600 * 10**9
    assert papi.parse_since("5s", now_ns=10 * 10**9) == 5 * 10**9
    assert papi.parse_since("123") == 123
