"""The plans PostgreSQL keeps for a port creation's prepared statements (fathom.store.db.run_prepared).

A prepared statement's generic plan is made once per connection (at its sixth run) and kept until its
tables are next analyzed: made while they were small, it must still probe an index by every column
the statement names, or each run costs more as the table grows."""
from __future__ import annotations

import re

import psycopg
import pytest
from sqlalchemy.engine import make_url

from fathom.store import db, ops


@pytest.fixture
def conn(postgres):
    url = make_url(postgres.new_database(migrated=True))
    with psycopg.connect(host=url.query["host"], port=int(url.query["port"]), user=url.username,
                         dbname=url.database, autocommit=True) as conn:
        yield conn


def test_the_interface_check_of_a_generic_plan_made_on_empty_tables_probes_both_columns_of_the_index(conn):
    sql, defaults = ops._port_context_sql(True, True, False, False, False)   # a node and an interface named
    names: list[str] = []

    def number(match):
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute("PREPARE check_read AS " + re.sub(r"%\((\w+)\)s", number, sql))
    values = {**defaults, "network_id": 1, "project": None, "node": "n1", "interface_name": "tap1"}
    explain = psycopg.ClientCursor(conn).execute(   # the values as literals: EXECUTE's own parameters
        f"EXPLAIN EXECUTE check_read({', '.join('%s' for _ in names)})", [values[n] for n in names])
    plan = "\n".join(r[0] for r in explain.fetchall())
    probe = re.search(r"Index (?:Only )?Scan using uq_ports_node_id_interface_name on ports ports_1.*\n\s*Index Cond: (.*)", plan)
    assert probe is not None, plan
    assert "node_id" in probe[1] and "interface_name" in probe[1], plan
