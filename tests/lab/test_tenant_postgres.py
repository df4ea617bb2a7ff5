"""The controller on PostgreSQL: the same code, a real PostgreSQL 15 server, a lab registered with it."""
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fathom.lab.controller import free_port
from fathom.lab.ovs import wait_for
from fathom.pki import Pki
from tests.unit.pgserver import PostgresServer

from .util import ping, running_lab

TOPOLOGY = """
networks:
  - {name: blue, type: vxlan, segmentation_id: 3001, cidr: 198.19.31.0/24}
nodes:
  - name: compute1
    vms: [{name: vm1, mac: "02:fa:00:00:31:01", ip: 198.19.31.11/24, network: blue}]
  - name: compute2
    vms: [{name: vm2, mac: "02:fa:00:00:31:02", ip: 198.19.31.12/24, network: blue}]
"""


@pytest.fixture
def controller_on_postgres(tmp_path):
    pg = PostgresServer().start()
    api_port, of_port = free_port(), free_port("0.0.0.0")
    log = open(tmp_path / "controller.log", "wb")
    Pki(tmp_path / "pki").init()   # TLS on OpenFlow and OVSDB: the lab issues node certificates from it
    proc = subprocess.Popen([str(Path(sys.executable).with_name("fathom")), "controller", "--db", pg.new_database(),
                             "--api-port", str(api_port), "--of-port", str(of_port), "--interval", "3",
                             "--pki-dir", str(tmp_path / "pki")],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{api_port}"
    try:
        for _ in range(150):
            try:
                if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        pg.stop()


def test_lab_under_a_controller_on_postgresql(controller_on_postgres, tmp_path):
    url = controller_on_postgres
    with running_lab("t3p", TOPOLOGY, standalone=False, controller=url, pki_dir=str(tmp_path / "pki")) as lab:
        # once in a full CI run the first pings were lost; the statuses below are the real subject here
        wait_for(lambda: ping(lab, "vm1", "198.19.31.12").returncode == 0, 10, "vm1 to reach vm2")
        ports = httpx.get(url + "/v1/ports").json()
        assert {p["name"]: p["status"] for p in ports} == {"vm1": "active", "vm2": "active"}
    # down removed the lab's objects from the controller it did not start
    assert httpx.get(url + "/v1/ports").json() == []
    assert httpx.get(url + "/v1/nodes").json() == []
