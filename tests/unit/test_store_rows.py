"""The ports part of the store read patched by row (fathom.store.changes, fathom.store.snapshot):
after each write of a random sequence through the API (and a few past it), on SQLite and on a real
PostgreSQL, the kept model and stored statuses equal a fresh whole read, and most port writes were
patched by row rather than read whole."""
from __future__ import annotations

import random

from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.orm import Session

from fathom.store import models as m
from fathom.store.changes import TableChanges
from fathom.store.snapshot import StoreReader, load_snapshot
from fathom.store.status import write_statuses

from .test_api import Client, api  # noqa: F401  (the fixture)

STEPS = 160


def read_whole(engine) -> tuple:
    stored: dict = {}
    with Session(engine) as s:
        return load_snapshot(s, stored), stored


class World:
    """Random writes over a few networks, nodes, groups and routers."""

    def __init__(self, client: Client, rng: random.Random, statuses_written):
        self.api, self.rng, self.statuses_written = client, rng, statuses_written
        self.nodes = [client.post("/nodes", {"name": f"c{i}", "tunnel_ip": f"198.18.0.{i}"})["name"]
                      for i in (1, 2)]
        self.groups = [client.post("/security-groups", {"name": f"g{i}"})["id"] for i in range(3)]
        self.nets: dict[int, list[int]] = {}   # network -> its subnets
        self.routers = [client.post("/routers", {"name": f"r{i}"})["id"] for i in range(2)]
        self.cidrs = 0
        for _ in range(2):
            self.network()

    def network(self):
        net = self.api.post("/networks", {"name": f"n{self.cidrs}"})
        self.nets[net["id"]] = []
        self.subnet(net["id"])

    def subnet(self, net_id):
        self.cidrs += 1
        sub = self.api.post("/subnets", {"network_id": net_id, "cidr": f"10.{self.cidrs}.0.0/24"})
        self.nets[net_id].append(sub["id"])

    def ports(self) -> list[dict]:
        return self.api.get("/ports")

    def step(self) -> str:
        rng, api = self.rng, self.api
        ports = self.ports()
        workloads = [p for p in ports if p["router_id"] is None]
        op = rng.choice(["create"] * 5 + ["update"] * 4 + ["delete"] * 3 + ["interface", "uninterface",
                        "network", "subnet", "delete_subnet", "delete_network", "group", "past_api"])
        if op == "create" and self.nets:
            net = rng.choice(list(self.nets))
            body = {"network_id": net, "name": f"p{rng.randrange(1000)}"}
            if rng.random() < 0.5:
                body |= {"node": rng.choice(self.nodes), "interface_name": f"t{rng.randrange(10**6)}"}
            if rng.random() < 0.3:
                body["fixed_ips"] = [{"subnet_id": s} for s in self.nets[net][:2]] if rng.random() < 0.7 else []
            if rng.random() < 0.5:
                body["security_groups"] = rng.sample(self.groups, rng.randrange(len(self.groups) + 1))
            if rng.random() < 0.1:
                body |= {"port_security": False, "security_groups": []}
            api.http.post("/v1/ports", json=body)
        elif op == "update" and workloads:
            p = rng.choice(workloads)
            body = {"name": f"u{rng.randrange(1000)}", "security_groups":
                    rng.sample(self.groups, rng.randrange(len(self.groups) + 1))}
            if rng.random() < 0.5:
                body |= {"node": rng.choice(self.nodes), "interface_name": f"t{rng.randrange(10**6)}"}
            api.http.patch(f"/v1/ports/{p['id']}", json=body)
        elif op == "delete" and workloads:
            api.http.delete(f"/v1/ports/{rng.choice(workloads)['id']}")
        elif op == "interface" and self.nets:
            sub = rng.choice([s for subs in self.nets.values() for s in subs] or [0])
            api.http.post(f"/v1/routers/{rng.choice(self.routers)}/interfaces", json={"subnet_id": sub})
        elif op == "uninterface":
            ifs = [p for p in ports if p["router_id"] is not None and p["fixed_ips"]]
            if ifs:
                p = rng.choice(ifs)
                api.http.delete(f"/v1/routers/{p['router_id']}/interfaces/{p['id']}")
        elif op == "network" and len(self.nets) < 4:
            self.network()
        elif op == "subnet" and self.nets:
            self.subnet(rng.choice(list(self.nets)))
        elif op == "delete_subnet" and self.nets:
            net = rng.choice(list(self.nets))
            if self.nets[net]:
                sub = rng.choice(self.nets[net])
                if api.http.delete(f"/v1/subnets/{sub}").status_code == 204:
                    self.nets[net].remove(sub)
        elif op == "delete_network" and self.nets:
            net = rng.choice(list(self.nets))   # its few ports first: a cascade to its subnets
            mine = [p for p in workloads if p["network_id"] == net]
            if len(mine) > 2:
                return "none"
            for p in mine:
                api.http.delete(f"/v1/ports/{p['id']}")
            if api.http.delete(f"/v1/networks/{net}").status_code == 204:
                del self.nets[net]
        elif op == "group":
            if rng.random() < 0.5 or len(self.groups) < 2:
                self.groups.append(api.post("/security-groups", {"name": "g"})["id"])
            elif api.http.delete(f"/v1/security-groups/{self.groups[-1]}").status_code == 204:
                self.groups.pop()
        elif op == "past_api" and ports:
            self.past_api(rng.choice(ports))
        return op

    def past_api(self, port: dict):
        """Writes the API does not make: by primary key in Core, in bulk, in raw SQL, a port inserted in
        Core, statuses."""
        engine = self.api.app.state.engine
        with Session(engine) as s, s.begin():
            choice = self.rng.randrange(6)
            if choice == 0:
                s.execute(update(m.Port).where(m.Port.id == port["id"]).values(name="core"))
            elif choice == 1:
                s.execute(update(m.Port).where(m.Port.network_id == port["network_id"]).values(name="bulk"))
            elif choice == 2:
                s.execute(text("UPDATE ports SET name = 'raw' WHERE id = :id"), {"id": port["id"]})
            elif choice == 3:
                first = s.scalar(select(m.IpAllocation.id).where(m.IpAllocation.port_id == port["id"]))
                if first is not None:
                    s.execute(delete(m.IpAllocation).where(m.IpAllocation.id == first))
            elif choice == 4:    # a port inserted in Core: the reader must find it by itself
                n = self.rng.randrange(10**6)
                s.execute(insert(m.Port).values(name="core", project_id="p1", network_id=port["network_id"],
                                                mac_address=f"02:00:00:{n >> 16:02x}:{n >> 8 & 255:02x}:{n & 255:02x}"))
            else:
                kind = "port" if port["router_id"] is None else "router_interface"
                written = {(kind, port["id"]): ("error", "rr")}
                write_statuses(s, written, {})        # as the reconciler does, and tells its reader
                self.statuses_written(written)


def test_the_ports_part_patched_by_row_equals_a_whole_read(api):  # noqa: F811
    engine = api.app.state.engine
    changes, reader = TableChanges(engine), StoreReader()
    rng = random.Random(19)
    world = World(api, rng, reader.statuses_written)
    changes.take()
    with Session(engine) as s:
        reader.read(s, {}, None)
    ops: dict[str, int] = {}
    last: set = set()
    for i in range(STEPS):
        op = world.step()
        ops[op] = ops.get(op, 0) + 1
        stored: dict = {}
        taken = changes.take()
        with Session(engine) as s:   # with the writes of the read before, as the reconciler reads
            kept = reader.read(s, stored, taken | last)
        last = taken
        whole, whole_stored = read_whole(engine)
        assert kept == whole, (i, op)
        assert stored == whole_stored, (i, op)
    assert len(reader.parts["ports"]["ports"]) > 5, ops
    # most port writes were patched, not read whole
    assert reader.patches["ports"] > 2 * reader.reads["ports"], (reader.patches, reader.reads, ops)
    assert reader.rows_read > 0


def test_a_port_delete_cascade_is_the_ports_own_rows_or_a_column_the_ports_part_does_not_read():
    """What lets a port delete patch the ports part: the tables the ports part reads that the
    delete cascades to (fathom.store.changes.PORT_ROWS, snapshot.PARTS)."""
    from fathom.store.snapshot import PARTS
    from fathom.store.tables import metadata
    cascades = {(t.name, fk.parent.name) for t in metadata.tables.values() for fk in t.foreign_keys
                if fk.column.table.name == "ports" and (fk.ondelete or "").upper() in ("CASCADE", "SET NULL")
                and t.name in PARTS["ports"][0]}
    assert cascades == {("ip_allocations", "port_id"), ("port_security_groups", "port_id"),
                        ("floating_ips", "port_id")}
    # the ports part reads only floating IPs' address ports, whose deletes are restricted
    assert metadata.tables["floating_ips"].c.address_port_id.foreign_keys.pop().ondelete == "RESTRICT"


def test_every_tracker_of_an_engine_sees_every_write(api):  # noqa: F811
    """The reconciler and the agents' desired state each follow the store's writes with a tracker
    of their own on the same engine: a commit counts for both."""
    engine = api.app.state.engine
    first, second = TableChanges(engine), TableChanges(engine)
    api.post("/nodes", {"name": "n9", "tunnel_ip": "198.18.0.9"})
    assert "nodes" in first.take() and "nodes" in second.take()
    api.post("/networks", {"name": "n9-net"})
    assert "networks" in second.take() and "networks" in first.take()


def test_a_port_the_api_creates_is_told_by_id_and_one_inserted_past_the_orm_is_looked_for(api):  # noqa: F811
    """The reader lists every port id only when a port came in another way than the ORM's insert."""
    engine = api.app.state.engine
    changes = TableChanges(engine)
    net = api.post("/networks", {"name": "told"})["id"]
    api.post("/subnets", {"network_id": net, "cidr": "198.18.60.0/24"})
    changes.take()
    bare = api.post("/ports", {"network_id": net, "name": "bare", "fixed_ips": []})["id"]
    addressed = api.post("/ports", {"network_id": net, "name": "addressed"})["id"]
    taken = changes.take()
    assert {("port", bare), ("port", addressed)} <= taken and ("port", None) not in taken, taken
    assert not any(isinstance(t, tuple) and t[0] == "port told" for t in taken)
    with Session(engine) as s, s.begin():
        s.execute(insert(m.Port).values(name="core", project_id="p1", network_id=net, mac_address="02:00:00:00:60:01"))
        s.add(m.Port(name="orm", project_id="p1", network_id=net, mac_address="02:00:00:00:60:02"))
    taken = changes.take()
    assert ("port", None) in taken, taken     # the Core insert's id is not known: the reader looks



def test_a_port_delete_reads_again_only_the_parts_whose_rows_name_the_port(api):  # noqa: F811
    """A port delete cascades, in the schema, to the floating IPs, tap policies and sampling rates
    that name it: a part keeping such rows is read again only when one of them names the port."""
    from .test_api_external import MEMBER, cloud
    c = cloud(api)
    engine = api.app.state.engine
    changes, reader = TableChanges(engine), StoreReader()
    with Session(engine) as s:
        reader.read(s, {}, None)
    changes.take()

    def read_again() -> set:
        before = dict(reader.reads)
        with Session(engine) as s:
            kept = reader.read(s, {}, changes.take())
        assert kept == read_whole(engine)[0]
        return {part for part, n in reader.reads.items() if n != before.get(part, 0)}

    def port(name: str) -> int:
        return api.post("/ports", {"network_id": c["net"]["id"], "name": name, "node": "c1", "interface_name": name,
                                   "project_id": "p1", "fixed_ips": [{"subnet_id": c["sub"]["id"]}]})["id"]
    free = port("free")
    read_again()
    api.delete(f"/ports/{free}")
    assert read_again() == set()
    api.patch(f"/routers/{c['router']['id']}", {"external_gateway": {"network_id": c["ext"]["id"]}}, headers=MEMBER)
    fip = api.post("/floatingips", {"floating_network_id": c["ext"]["id"], "port_id": c["port"]["id"]},
                   headers=MEMBER)
    sender, receiver, monitor = port("s"), port("r"), port("m")
    api.post("/taps", {"sender": "s", "receiver": "r", "monitor": "m"})
    read_again()
    api.delete(f"/ports/{c['port']['id']}")        # its floating IP loses it
    assert read_again() == {"floating_ips"}
    assert api.get(f"/floatingips/{fip['id']}", headers=MEMBER)["port_id"] is None
    api.delete(f"/ports/{monitor}")                # the tap policy loses its monitor
    assert read_again() == {"taps"}
    other = port("other")
    read_again()
    api.delete(f"/ports/{other}")                  # names nothing: nothing read again
    assert read_again() == set()
    assert {sender, receiver} <= {p.id for p in reader.parts["ports"]["ports"]}


def test_every_part_that_reads_a_table_a_port_delete_cascades_to_says_which_ports_it_names():
    from fathom.store.changes import _cascades
    from fathom.store.snapshot import PARTS, PORTS_NAMED
    cascaded = {name for name, (tables, _) in PARTS.items() if tables & _cascades()["ports"]}
    assert cascaded - {"ports"} == set(PORTS_NAMED)
