"""Lab test of `fathom bench ovn-compare --replicas 3` (labs oq1 and oq3): one short round of fathom
with one controller against fathom with three replicas, each on a database of one PostgreSQL the
bench starts. It checks that the benchmark measures what it says, not how fast anything is: both
labs carry traffic, every measured port turns active and echoes after its API call, the cluster's
calls go round its replicas, each port's record names the master of c1's br-int, the summary
shows both and their ratio, and the labs and PostgreSQL are gone afterwards."""
from __future__ import annotations

import pytest

from fathom.bench import postgres
from fathom.bench.ovncompare import PATHS, ClusterBench, markdown
from fathom.lab.lab import Lab

pytestmark = pytest.mark.lab   # needs root: without it the lab cannot come up and the test fails

PORTS = 3   # one for each replica


@pytest.fixture(scope="module")
def doc():
    before = {p.name for p in postgres._parents()[0].glob(postgres.PREFIX + "*")}
    doc = ClusterBench(prefix="oq", replicas=3, repeats=1, ports=PORTS).run()
    doc["pg_left"] = {p.name for p in postgres._parents()[0].glob(postgres.PREFIX + "*")} - before
    print("lab bring-ups tried again:", doc["up_failures"])
    return doc


def test_both_carry_traffic(doc):
    assert doc["traffic_check"] == {s: {p: True for p in PATHS} for s in ("fathom-1", "fathom-3")}


def test_every_port_turns_active_and_echoes_after_its_api_call(doc):
    for system in ("fathom-1", "fathom-3"):
        cell = doc["port_up"][system]["plug_first"]
        assert cell["ports"] == PORTS and cell["never_up"] == 0 and cell["never_echo"] == 0, cell
        for run in cell["runs"]:
            assert run["t_plug_done"] <= run["t_api"] <= run["t_api_done"] <= run["t_up"], run
            assert run["t_echo"] > run["t_plug"] and run["up_ms"] > 0, run
        assert doc["repeats"][0][system]["up_ms"]["n"] == PORTS


def test_the_clusters_calls_go_round_its_replicas_and_name_the_master(doc):
    runs = doc["port_up"]["fathom-3"]["plug_first"]["runs"]
    assert [r["replica"] for r in runs] == [0, 1, 2]
    assert all(r["master"] in (0, 1, 2) for r in runs), runs
    assert not any("replica" in r for r in doc["port_up"]["fathom-1"]["plug_first"]["runs"])
    split = doc["by_replica"]
    # the split counts the ports that turned active, each once
    active = sum(r["up_ms"] is not None for r in runs)
    assert split["call_to_master"]["up_ms"].get("n", 0) + split["call_to_other"]["up_ms"].get("n", 0) == active
    text = markdown(doc)
    assert "| fathom-1 | 3 |" in text and "| fathom-3 | 3 |" in text and "| ratio |" in text, text


def test_labs_and_postgres_removed(doc):
    assert not Lab("oq1").exists() and not Lab("oq3").exists()
    assert doc["pg_left"] == set()
