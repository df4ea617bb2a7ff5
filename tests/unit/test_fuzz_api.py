"""A bounded schemathesis run over the whole API, on SQLite and on a real PostgreSQL: every
operation with schema-conforming and schema-violating requests (fixed seed), each drawn request sent
to both stores, and the stateful sequences schemathesis infers from the schema (create -> show /
update / delete). Whatever is sent: no 5xx, every status is one the OpenAPI documents, every body
matches its schema.

Budget: EXAMPLES per operation and mode (environment FATHOM_FUZZ_EXAMPLES), at least 25 stateful
sequences; about two minutes in all.
"""
from __future__ import annotations

import os
import warnings

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.core.failures import FailureGroup
    from schemathesis.generation.modes import GenerationMode
    from schemathesis.specs.openapi.checks import (
        content_type_conformance, response_schema_conformance, status_code_conformance,
    )

from fathom.api import create_app
from fathom.model.flow_batch import CONTENT_TYPE as FLOW_BATCH

# a flow-records batch is bytes: drawn and sent as any binary body is
schemathesis.serializer.alias(FLOW_BATCH, "application/octet-stream")

from .auth import headers_for

EXAMPLES = int(os.environ.get("FATHOM_FUZZ_EXAMPLES", "15"))
SEED = 20261123
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=list(HealthCheck))


def seed_store(app) -> list[dict]:
    """One object of each kind, so that generated ids sometimes hit; returns the identities to
    call as (admin, two members, a service acting for p1, an agent)."""
    from fastapi.testclient import TestClient
    admin = headers_for(app)
    http = TestClient(app, headers=admin)
    http.post("/v1/nodes", json={"name": "c1", "tunnel_ip": "198.18.0.1"}).raise_for_status()
    net = http.post("/v1/networks", json={"name": "n", "project_id": "p1"}).json()
    sub = http.post("/v1/subnets", json={"network_id": net["id"], "cidr": "10.0.0.0/24"}).json()
    for i in (1, 2, 3):
        http.post("/v1/ports", json={"network_id": net["id"], "name": f"vm{i}", "node": "c1",
                                     "interface_name": f"vm{i}", "mac_address": f"02:00:00:00:00:0{i}"}
                  ).raise_for_status()
    router = http.post("/v1/routers", json={"project_id": "p1"}).json()
    http.post(f"/v1/routers/{router['id']}/interfaces", json={"subnet_id": sub["id"]}).raise_for_status()
    http.post("/v1/taps", json={"sender": "vm1", "receiver": "vm2", "monitor": "vm3"}).raise_for_status()
    return [admin, headers_for(app, "p1", ("member",)), headers_for(app, "p2", ("member",)),
            {**headers_for(app, "svc", roles="service"), "X-Project": "p1"},
            headers_for(app, "admin", ("agent",), node="c1")]


def reset_store(app) -> list[dict]:
    """Empty every table, restart the ids and seed again."""
    from sqlalchemy import text

    from fathom.store.tables import metadata
    engine = app.state.engine
    tables = [t.name for t in metadata.sorted_tables]
    with engine.begin() as c:
        if engine.dialect.name == "postgresql":
            c.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for t in reversed(tables):
                c.execute(text(f"DELETE FROM {t}"))
            c.execute(text("DELETE FROM sqlite_sequence"))
    return seed_store(app)


def fuzzed_app(db_url: str):
    # an agent's long-poll is held at most 0.1 s here: a drawn `after` equal to the revision would
    # otherwise hold each example for its `timeout` (up to a minute)
    app = create_app(db_url, agent_max_wait=0.1)
    return app, seed_store(app)


@pytest.fixture
def fuzzed(db_url):
    app, identities = fuzzed_app(db_url)
    yield app, identities
    app.state.engine.dispose()


@pytest.fixture
def fuzzed_stores(tmp_path, postgres):
    """store name -> (app, identities): the same objects seeded on SQLite and on PostgreSQL."""
    stores = {"sqlite": fuzzed_app(f"sqlite:///{tmp_path / 'fathom.db'}"),
              "postgresql": fuzzed_app(postgres.new_database(migrated=True))}
    yield stores
    for app, _ in stores.values():
        app.state.engine.dispose()


def _fuzz_operations(stores: dict, mode: GenerationMode) -> list[str]:
    """Drawing a request costs more than answering it: each one drawn is sent to every store (the
    same identity on each), so both see exactly the same requests."""
    first, identities = next(iter(stores.values()))
    schema = schemathesis.openapi.from_asgi("/openapi.json", first)
    failures = []
    for result in schema.get_all_operations():
        op = result.ok()

        @FUZZ
        @seed(SEED)
        @given(case=op.as_strategy(generation_mode=mode), who=st.sampled_from(range(len(identities))))
        def run(case, who):
            for store, (app, ids) in stores.items():
                try:
                    case.validate_response(case.call(app=app, headers=ids[who]), checks=CHECKS)
                except (Exception, FailureGroup) as e:  # noqa: BLE001 - names the store that answered so
                    raise AssertionError(f"on {store}: {e}") from e

        try:
            run()
        except Exception as e:  # noqa: BLE001 - collected: one report for every operation
            failures.append(f"{op.method.upper()} {op.path} ({mode}): {str(e)[:1500]}")
    return failures


def test_fuzz_every_operation(fuzzed_stores):
    failures = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        failures += _fuzz_operations(fuzzed_stores, mode)
    assert not failures, "\n\n".join(failures)


def test_fuzz_stateful_links(fuzzed):
    """Sequences along the links schemathesis infers (a created object's id into the calls on it).
    Responses feed later draws, so every sequence starts from the same store (ids included):
    otherwise Hypothesis sees draws that depend on earlier examples and refuses them as flaky."""
    app, _ = fuzzed
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    calls: list[str] = []
    admin: dict = {}

    class Machine(schema.as_state_machine()):
        def __init__(self):
            admin.update(reset_store(app)[0])
            super().__init__()

        def get_call_kwargs(self, case):
            calls.append(case.operation.label)
            return {"headers": admin}

        def validate_response(self, response, case, additional_checks=(), **kwargs):
            case.validate_response(response, checks=CHECKS)

    Machine.TestCase.settings = settings(max_examples=max(25, EXAMPLES), stateful_step_count=6, derandomize=True,
                                         database=None, deadline=None, suppress_health_check=list(HealthCheck))
    Machine.run()
    # the sequences went beyond single calls: creations followed by calls on what they created
    assert len(calls) > 50 and len(set(calls)) > 15, (len(calls), sorted(set(calls)))
