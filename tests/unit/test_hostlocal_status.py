"""The agents' statuses after a pass (fathom.controller.hostlocal.HostLocalStatus) over a real store
(SQLite and PostgreSQL): the agents' reports and the PPTMon attachments are read again only when
the reconciler's store read covered their tables (or read the whole store), and what a report says
is always in the next pass's statuses."""
from __future__ import annotations

import warnings

from sqlalchemy import event
from sqlalchemy.orm import Session

from fathom.model.hostlocal_desired import desired as hostlocal_desired
from fathom.controller.hostlocal import HostLocalStatus
from fathom.controller.reconciler import Reconciler
from fathom.controller.results import PassResult
from fathom.model.hostlocal import digest, owner_key
from fathom.store import agents as ag
from fathom.store.db import session_factory

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from fathom.api import create_app  # noqa: E402

from .auth import headers_for  # noqa: E402


class Store:
    """A store with one node, a DHCP subnet and a port there (the node's agent must run its DHCP
    server); a reconciler that only reads it, and the agents' statuses after each `pass_`."""

    def __init__(self, db_url: str):
        app = create_app(db_url)
        self.http = TestClient(app, headers=headers_for(app))
        self.engine = app.state.engine
        self.post("/nodes", {"name": "c1", "tunnel_ip": "198.18.0.1"})
        self.net = self.post("/networks", {"name": "blue"})
        self.post("/subnets", {"network_id": self.net["id"], "cidr": "10.0.0.0/24"})
        self.post("/ports", {"network_id": self.net["id"], "name": "vm1", "node": "c1", "interface_name": "tap1"})
        self.rec = Reconciler(session_factory(self.engine), None, None)
        self.hostlocal = HostLocalStatus(session_factory(self.engine))
        self.agent_reads = 0
        event.listen(self.engine, "before_cursor_execute", self._counted)

    def _counted(self, _conn, _cursor, statement, *_args) -> None:
        if "node_agents" in statement and statement.lstrip().upper().startswith("SELECT"):
            self.agent_reads += 1

    def post(self, path, body):
        r = self.http.post("/v1" + path, json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def pass_(self, read_store: bool = True, whole: bool = False) -> tuple:
        """A pass (reading the store's written parts, like one woken by an API write, or not at
        all, like one woken by OVSDB): the DHCP server's status on c1, and whether the agents'
        reports were read."""
        if read_store or self.rec.store_model is None:
            self.rec.store_model = self.rec.store.read(whole=whole or self.rec.store_model is None)
        before, result = self.agent_reads, PassResult()
        self.hostlocal.after_pass(self.rec, self.rec.store_model, result)
        (node, st, reason), = result.dhcp_servers[self.net["id"]]
        assert node == "c1"
        return (st, reason), self.agent_reads > before

    def report(self, status: str) -> None:
        """c1's agent reports its DHCP server, as the API keeps it (one committed write)."""
        (server,) = hostlocal_desired(self.rec.store_model)["c1"]
        with Session(self.engine) as s, s.begin():
            ag.record_report(s, "c1", agent_started=1.0, applied_revision=1, facts={},
                             objects={owner_key(server.owner): {"status": status, "reason": None,
                                                                "applied": digest([server])}})


def test_a_report_is_seen_by_the_pass_that_reads_its_table_and_nothing_is_read_again_otherwise(db_url):
    store = Store(db_url)
    (st, reason), read = store.pass_()
    assert st == "error" and "no agent on node c1 has reported" in reason and read
    assert store.pass_(read_store=False) == ((st, reason), False)     # an OVSDB event: nothing new to read
    store.report("active")
    assert store.pass_() == (("active", None), True)                # the report's write woke a store read
    assert store.pass_(read_store=False) == (("active", None), False)
    for name in ("vm2", "vm3"):   # writes of other tables (the first read after also covers the report's)
        store.post("/ports", {"network_id": store.net["id"], "name": name})
        _, read = store.pass_()
    assert read is False
    store.report("error")
    assert store.pass_()[0][0] == "error"
    store.report("active")
    assert store.pass_(read_store=False)[0][0] == "error"          # not read yet: no pass read its table
    assert store.pass_() == (("active", None), True)
    assert store.pass_(whole=True)[1] is True                       # a sync or audit reads it all again


def test_a_new_port_rebuilds_its_own_dhcp_server_only(db_url):
    """The passes' host-local state follows the change through the store reader: it keeps the
    Port objects of unchanged ports, so a new port's pass builds one DHCP server again (its own),
    and a read of the whole store builds them all."""
    store = Store(db_url)
    store.post("/nodes", {"name": "c2", "tunnel_ip": "198.18.0.2"})
    red = store.post("/networks", {"name": "red"})
    store.post("/subnets", {"network_id": red["id"], "cidr": "10.0.1.0/24"})
    for i, (net, node) in enumerate([(red, "c1"), (red, "c2"), (store.net, "c2")]):
        store.post("/ports", {"network_id": net["id"], "name": f"p{i}", "node": node, "interface_name": f"t{i}"})

    def pass_(whole: bool = False) -> int:
        store.rec.store_model = store.rec.store.read(whole=whole or store.rec.store_model is None)
        store.hostlocal.after_pass(store.rec, store.rec.store_model, PassResult())
        return store.hostlocal.desired.dhcp.rebuilt

    assert pass_(whole=True) == 4                          # blue and red, on c1 and c2
    pass_()                  # reads the tables of the read before again (writes it may have missed)
    store.post("/ports", {"network_id": red["id"], "name": "p9", "node": "c2", "interface_name": "t9"})
    assert pass_() == 1
    servers = {(n, s.network_id): s for n, objs in hostlocal_desired(store.rec.store_model).items() for s in objs}
    assert len(servers[("c2", red["id"])].hosts) == 2 and len(servers) == 4
    assert pass_(whole=True) == 4
