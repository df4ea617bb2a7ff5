"""The web console in a real browser (Debian's headless chromium, driven by selenium through Debian's
chromedriver) against a lab's controller: two tenants (alpha, beta), real OVS.

Every page loads with no console error; a port made through the API appears on the topology page
without a reload (the change notice carries it), and goes when deleted; a node opened by its URL lists its ports; a name with HTML in it is shown as text; a member sees only its project's objects
(pages and data calls, the topology's summary counts, and its stream of change notices); a flow removed from a switch shows as
missing on its port's page; a trace from a port's page shows the verdict and the path drawn; the flow
records page loads, and sets a project's sampling rates (a refusal shown as the API answers it); the benchmarks page plots a results file; the taps page shows a policy's counters moving under traffic and downloads a
capture of its monitor made by the monitor's node agent; a page open across a controller restart
hears of a new port without a reload; a bad or revoked token goes back to the login page; a port's
page shows its counters rising with pings; Keystone credentials (a real Keystone) log a member in to
its project only, a wrong password is said, a token revoked in Keystone goes back to the login page. Screenshots go to $FATHOM_CONSOLE_SHOTS (default
/tmp/fathom-console-shots; `FATHOM_CONSOLE_SHOTS=docs/img` refreshes the docs' images).
"""
from __future__ import annotations

import io
import os
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from scapy.all import ICMP, IP, rdpcap
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import fathom.lab
from fathom.agent.capture import whole_records
from fathom.bench.browser import headless_chromium
from fathom.host import exec as host_exec
from fathom.lab import keystone as keystone_lab

from .util import lab_api, running_lab

pytestmark = pytest.mark.lab

TOPOLOGY = (Path(fathom.lab.__file__).parent / "topologies" / "tenants.yaml").read_text()
SHOTS = Path(os.environ.get("FATHOM_CONSOLE_SHOTS", "/tmp/fathom-console-shots"))
KEYSTONE_PASSWORD = "cs-Alice-pw-7"
KEYSTONE_CACHE_SECONDS = 2      # the controller trusts a Keystone token's validation this long


@pytest.fixture(scope="module")
def keystone(tmp_path_factory):
    """A real Keystone (fathom.lab.keystone) whose tokens the lab's controller validates: started
    before the lab, its service token and URL in the environment the controller starts with."""
    assert keystone_lab.available() is None, keystone_lab.available()
    started = time.monotonic()
    server = keystone_lab.KeystoneServer(tmp_path_factory.mktemp("keystone")).start()
    print(f"keystone ready in {time.monotonic() - started:.1f} s")
    service = server.dir / "service-token"
    service.write_text(server.admin_token())
    service.chmod(0o600)
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("FATHOM_KEYSTONE_URL", server.url)
            env.setenv("FATHOM_KEYSTONE_TOKEN_FILE", str(service))
            env.setenv("FATHOM_KEYSTONE_CACHE_SECONDS", str(KEYSTONE_CACHE_SECONDS))
            yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def lab(keystone):
    with running_lab("cs1", TOPOLOGY, standalone=False) as lab:
        yield lab


@pytest.fixture(scope="module")
def admin(lab):
    with lab_api(lab) as api:
        yield api


@pytest.fixture(scope="module")
def url(lab):
    return lab.state()["controller"]["url"]


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as driver:
        SHOTS.mkdir(parents=True, exist_ok=True)
        print(f"console screenshots in {SHOTS}")
        yield driver


def token_of(admin: httpx.Client, project: str, roles=("member",)) -> dict:
    """A new token (its `token` and `id`)."""
    r = admin.post("/tokens", json={"project_id": project, "roles": list(roles), "name": f"qf {project}"})
    assert r.status_code == 201, r.text
    return r.json()


def log_in(browser, url: str, token: str, page: str = "/console/topology") -> None:
    """Through the login page, as a user would: it sends us back to `page`."""
    browser.get(f"{url}{page}")
    wait(browser, lambda d: d.current_url.startswith(f"{url}/console/login"), "the login page")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(browser, lambda d: d.current_url == f"{url}{page}", page)


def as_admin(browser, url: str, admin: httpx.Client) -> None:
    """This tab holds the admin's token (whatever the tests before left in it)."""
    browser.get(f"{url}/console/login")
    browser.execute_script("sessionStorage.setItem('fathom.token', arguments[0])", admin.headers["authorization"].split()[1])


def wait(browser, predicate, what: str, timeout: float = 10):
    try:
        return WebDriverWait(browser, timeout, poll_frequency=0.05).until(predicate)
    except Exception as e:
        shot(browser, "failed")
        raise AssertionError(f"waited {timeout} s for {what}; page {browser.current_url}: "
                             f"{browser.find_element(By.TAG_NAME, 'body').text[:2000]}") from e


def cell_texts(browser, section: str) -> list[str]:
    """The texts of a table's cells, read at once (the page replaces its tables as it redraws)."""
    return browser.execute_script(
        "return [...document.querySelectorAll(`#${arguments[0]} td`)].map(td => td.textContent)", section)


def errors(browser) -> list[dict]:
    """The console's errors since the last call (console.error, uncaught exceptions, failed loads)."""
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def shot(browser, name: str) -> None:
    browser.save_screenshot(str(SHOTS / f"console-{name}.png"))


def test_topology_live_and_names_as_text(lab, admin, url, browser):
    browser.get(f"{url}/console/topology")
    browser.execute_script("sessionStorage.clear()")
    log_in(browser, url, admin.headers["authorization"].split()[1])
    wait(browser, lambda d: "compute1" in cell_texts(d, "nodes") and "vm1" in cell_texts(d, "ports"), "nodes and ports")
    wait(browser, lambda d: "live" in d.find_element(By.ID, "live").text, "the change notices")
    browser.execute_script("window.qfNoReload = true")
    blue = next(n for n in admin.get("/networks").json() if n["name"] == "blue")
    started = time.monotonic()
    port = admin.post("/ports", json={"network_id": blue["id"], "name": "qf-live", "project_id": "alpha"}).json()
    wait(browser, lambda d: "qf-live" in cell_texts(d, "ports"), "the new port, without a reload", timeout=5)
    print(f"a port made through the API shown after {time.monotonic() - started:.2f} s")
    assert browser.execute_script("return window.qfNoReload") is True
    # a name with HTML in it is text, in the tables and the graph alike
    hostile = "<script>alert(1)</script>"
    net = admin.post("/networks", json={"name": hostile, "project_id": "alpha"}).json()
    wait(browser, lambda d: hostile in cell_texts(d, "networks"), "the network named as HTML, as text")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text
    assert not browser.find_elements(By.CSS_SELECTOR, "#networks script"), "a name became markup"
    assert errors(browser) == []
    shot(browser, "topology")
    admin.delete(f"/ports/{port['id']}")
    wait(browser, lambda d: "qf-live" not in cell_texts(d, "ports"), "the port gone, without a reload", timeout=5)
    admin.delete(f"/networks/{net['id']}")
    # a node opened by its URL: its ports only
    browser.get(f"{url}/console/topology?node=compute2")
    wait(browser, lambda d: "vm3" in cell_texts(d, "ports"), "compute2's ports")
    assert "vm1" not in cell_texts(browser, "ports")


def test_port_page_counts_traffic_and_shows_a_removed_flow_as_missing(lab, admin, url, browser):
    vm1 = next(p for p in admin.get("/ports", params={"name": "vm1"}).json())
    as_admin(browser, url, admin)
    errors(browser)
    browser.get(f"{url}/console/port/{vm1['id']}")
    wait(browser, lambda d: "desired and actual agree" in d.find_element(By.ID, "flows").text, "vm1's flows in sync")
    assert "default" in browser.find_element(By.ID, "groups").text
    # its counters (rows: from the port, to the port; columns: packets, bytes, dropped, errors) rise
    # with 5 pings from vm1 to vm3: 5 requests from the port, 5 replies to it
    packets = lambda d: [int(c) for c in cell_texts(d, "counters")[1::5][:2]]
    wait(browser, lambda d: len(packets(d)) == 2, "vm1's counters")
    before, read_at = packets(browser), browser.find_element(By.CSS_SELECTOR, "#counters time").get_attribute("datetime")
    lab.run("vm1", "ping", "-q", "-i", "0.2", "-c", "5", "198.19.1.13", check=True)
    wait(browser, lambda d: all(a - b >= 5 for a, b in zip(packets(d), before)), "the pings counted")
    assert browser.find_element(By.CSS_SELECTOR, "#counters time").get_attribute("datetime") > read_at
    assert "on compute1" in browser.find_element(By.ID, "counters-read").text
    # the API: the port's project reads them, another project's token is told the port does not exist
    alpha = httpx.get(f"{url}/v1/ports/{vm1['id']}/counters",
                      headers={"Authorization": f"Bearer {token_of(admin, 'alpha')['token']}"}).json()
    assert alpha["node"] == "compute1" and alpha["counters"]["rx_packets"] >= before[0] + 5, alpha
    beta = httpx.get(f"{url}/v1/ports/{vm1['id']}/counters",
                     headers={"Authorization": f"Bearer {token_of(admin, 'beta')['token']}"})
    assert beta.status_code == 404
    assert errors(browser) == []
    shot(browser, "port")
    # a flow of the port removed from compute1's br-int: missing on the page until the controller's
    # check (every 10 s in the lab) puts it back; tried again if the check came first
    desired = admin.get("/nodes/compute1/flows").json()["desired"]
    flow = next(f for stage in desired.values() for f in stage if f"{5 << 48 | vm1['id']:x}" in f)
    cookie = flow.split("cookie=")[1].split(",")[0]
    for _ in range(3):
        lab.run("compute1", "ovs-ofctl", "-O", "OpenFlow14", "del-flows", "br-int", f"cookie={cookie}/-1", check=True)
        browser.refresh()
        try:
            wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#flows .missing"), "a flow marked missing", 5)
            break
        except AssertionError:
            continue
    else:
        pytest.fail("the removed flow was never shown missing")
    assert cookie in browser.find_element(By.CSS_SELECTOR, "#flows .missing").text
    shot(browser, "port-missing-flow")


def test_chain_page(lab, admin, url, browser):
    blue = next(n for n in admin.get("/networks").json() if n["name"] == "blue")
    made = []

    def make(path, body):
        r = admin.post(path, json=body)
        assert r.status_code == 201, r.text
        made.append(path + "/" + str(r.json()["id"]))
        return r.json()
    ports = [make("/ports", {"network_id": blue["id"], "name": f"qf-fw-{side}", "project_id": "alpha",
                             "port_security": False, "security_groups": []})
             for side in ("in", "out")]
    pair = make("/sfc/port_pairs", {"name": "qf-fw", "ingress": ports[0]["id"], "egress": ports[1]["id"],
                                    "project_id": "alpha"})
    group = make("/sfc/port_pair_groups", {"name": "qf-fws", "port_pairs": [pair["id"]], "project_id": "alpha"})
    vm1 = admin.get("/ports", params={"name": "vm1"}).json()[0]
    fc = make("/sfc/flow_classifiers", {"name": "qf-web", "logical_source_port": vm1["id"], "protocol": 6,
                                        "destination_port_range_min": 80, "destination_port_range_max": 80,
                                        "project_id": "alpha"})
    chain = make("/sfc/port_chains", {"name": "qf-web", "port_pair_groups": [group["id"]], "flow_classifiers": [fc["id"]],
                                      "pptmon": {"period_ns": 1_000_000_000}, "project_id": "alpha"})
    try:
        errors(browser)
        browser.get(f"{url}/console/chain/{chain['id']}")
        wait(browser, lambda d: "qf-fws" in d.find_element(By.ID, "hops").text, "the chain's hops")
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chart .uplot"), "the chart")
        assert "qf-fw" in browser.find_element(By.ID, "hops").text
        assert errors(browser) == []
        shot(browser, "chain")
    finally:
        browser.get("about:blank")      # the page polls the chain: leave it before deleting it
        for path in reversed(made):
            admin.delete(path)


def test_trace_page_from_a_port(lab, admin, url, browser):
    vm1 = admin.get("/ports", params={"name": "vm1"}).json()[0]
    errors(browser)
    browser.get(f"{url}/console/port/{vm1['id']}")
    # found and clicked at once: the page redraws its title (and the link) after each change notice
    wait(browser, lambda d: d.execute_script("const a = document.getElementById('trace-link'); a && a.click(); return !!a"),
         "the port's trace link")
    wait(browser, lambda d: d.current_url == f"{url}/console/trace?port={vm1['id']}", "the trace page")
    wait(browser, lambda d: d.find_element(By.ID, "port").get_attribute("value") == str(vm1["id"]), "vm1 chosen")
    browser.find_element(By.ID, "to").send_keys("198.19.1.13")       # vm3, on compute2
    browser.find_element(By.CSS_SELECTOR, "#form button[type=submit]").click()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#verdict .status.delivered"), "the verdict")
    assert "delivered to port vm3 on compute2" in browser.find_element(By.ID, "verdict").text
    drawn = browser.execute_script("const s = document.querySelector('#picture svg'); "
                                   "return s && s.namespaceURI === 'http://www.w3.org/2000/svg' ? s.textContent : null")
    assert drawn is not None and "vm1" in drawn and "delivered" in drawn, drawn
    assert any("br-int compute2" in c for c in cell_texts(browser, "hops")), cell_texts(browser, "hops")
    assert errors(browser) == []
    shot(browser, "trace")


def test_flow_records_page(lab, admin, url, browser):
    errors(browser)
    browser.get(f"{url}/console/flow-records")
    wait(browser, lambda d: "no records in the last 5 minutes" in d.find_element(By.ID, "drops").text,
         "the drops (none: the lab samples nothing)")
    assert "no records in the last 5 minutes" in browser.find_element(By.ID, "top").text
    assert errors(browser) == []
    shot(browser, "flow-records")


def test_flow_records_page_sets_sampling_rates(lab, admin, url, browser):
    """A member sets its project's rates with the form (read back through the API); another
    project's are refused by the API, and the page says so with the API's status and reason."""
    browser.get(f"{url}/console/login")
    browser.execute_script("sessionStorage.setItem('fathom.token', arguments[0])", token_of(admin, "alpha")["token"])
    browser.get(f"{url}/console/flow-records")
    wait(browser, lambda d: d.find_element(By.ID, "rate-project").get_attribute("value") == "alpha", "the form")

    def submit(project: str, ingress: int) -> str:
        form = {"rate-project": project, "rate-ingress": str(ingress), "rate-drop": "1"}
        for field, value in form.items():
            browser.find_element(By.ID, field).clear()
            browser.find_element(By.ID, field).send_keys(value)
        browser.execute_script("document.getElementById('rate-result').textContent = ''")
        browser.find_element(By.CSS_SELECTOR, "#sampling button").click()
        return wait(browser, lambda d: d.find_element(By.ID, "rate-result").text, "the answer")
    try:
        assert submit("alpha", 1000) == "set: project alpha, ingress 1000, admit 0, drop 1"
        rows = [r for r in admin.get("/flow-records/config").json() if r["project_id"] == "alpha"]
        assert rows == [{"project_id": "alpha", "port_id": None, "ingress": 1000, "admit": 0, "drop": 1}]
        wait(browser, lambda d: "1000" in cell_texts(d, "rates"), "the rates read again")
        refused = submit("beta", 500)
        assert refused.startswith("refused (403): only an admin can set another project's"), refused
        assert "beta" not in [r["project_id"] for r in admin.get("/flow-records/config").json()]
        shot(browser, "flow-records-sampling")
    finally:
        admin.delete("/flow-records/config", params={"project_id": "alpha"})


def test_benchmarks_page(lab, admin, url, browser):
    as_admin(browser, url, admin)
    errors(browser)
    browser.get(f"{url}/console/benchmarks?file=trace/results.json")
    wait(browser, lambda d: "trace/results.json" in d.find_element(By.ID, "files").text, "the results files")
    wait(browser, lambda d: any("trace_ms.warm.wall" in c for c in cell_texts(d, "dists")), "the trace's distributions")
    assert browser.find_elements(By.CSS_SELECTOR, "#dist-chart .uplot")
    assert errors(browser) == []
    shot(browser, "benchmarks")


def test_taps_page_counts_copies_and_downloads_a_capture(lab, admin, url, browser, tmp_path):
    downloads = tmp_path
    r = admin.post("/taps", json={"name": "cs-icmp", "sender": "vm1", "receiver": "vm3", "monitor": "vm2",
                                  "ip_proto": "icmp", "project_id": "alpha"})
    assert r.status_code == 201, r.text
    tap = admin.get(f"/taps/{r.json()['id']}", params={"wait": "active", "timeout": 10}).json()
    assert tap["status"] == "active", tap
    ping = subprocess.Popen(host_exec.argv(["ping", "-q", "-i", "0.2", "-c", "40", "198.19.1.13"], lab.ns("vm1")),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        as_admin(browser, url, admin)
        errors(browser)
        browser.get(f"{url}/console/taps")
        wait(browser, lambda d: "cs-icmp" in cell_texts(d, "taps"), "the policy")
        # columns: ..., copies (packets), copies (bytes), delivered (packets), delivered (bytes)
        counters = lambda d: [int(c.replace(",", "")) for c in cell_texts(d, "taps")[-4:] if c not in ("-", "")]
        wait(browser, lambda d: len(counters(d)) == 4 and min(counters(d)) > 0, "copies made and delivered")
        seconds = browser.find_element(By.ID, "seconds")
        seconds.clear()
        seconds.send_keys("2")
        browser.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
        browser.find_element(By.CSS_SELECTOR, "#capture button[type=submit]").click()
        wait(browser, lambda d: d.find_elements(By.ID, "pcap"), "the capture", timeout=15)
        file = downloads / f"tap-{tap['id']}.pcap"
        wait(browser, lambda d: file.is_file() and file.stat().st_size > 0, "the pcap file downloaded")
        data = file.read_bytes()
        shot(browser, "taps")
    finally:
        ping.kill()
        ping.wait()
        admin.delete(f"/taps/{tap['id']}")
    # what vm2's port received: whole records, vm1's pings to vm3 copied (requests, not the replies)
    assert whole_records(data, len(data)) == (data, len(rdpcap(io.BytesIO(data))))
    pings = [(p[IP].src, p[IP].dst, p[ICMP].type) for p in rdpcap(io.BytesIO(data)) if ICMP in p]
    assert pings and set(pings) == {("198.19.1.11", "198.19.1.13", 8)}, pings
    assert errors(browser) == []


def test_a_page_open_across_a_controller_restart_reconnects(lab, admin, url, browser):
    as_admin(browser, url, admin)
    browser.get(f"{url}/console/topology")
    wait(browser, lambda d: "vm1" in cell_texts(d, "ports") and "live" in d.find_element(By.ID, "live").text,
         "the topology, live")
    browser.execute_script("window.qfNoReload = true")
    started = time.monotonic()
    lab.restart_controller()
    restarted = time.monotonic()
    blue = next(n for n in admin.get("/networks").json() if n["name"] == "blue")
    port = admin.post("/ports", json={"network_id": blue["id"], "name": "cs-after-restart", "project_id": "alpha"})
    assert port.status_code == 201, port.text
    try:
        wait(browser, lambda d: "cs-after-restart" in cell_texts(d, "ports"), "the port made after the restart", 15)
        print(f"controller restarted in {restarted - started:.1f} s; the port shown {time.monotonic() - restarted:.1f} s later")
        assert browser.execute_script("return window.qfNoReload") is True
        assert browser.find_element(By.ID, "live").text == "live"
    finally:
        admin.delete(f"/ports/{port.json()['id']}")
    errors(browser)     # the dropped stream and the reads refused while the controller was away


def test_member_sees_its_project_only(lab, admin, url, browser):
    alpha = token_of(admin, "alpha")["token"]
    red1 = admin.get("/ports", params={"name": "red1"}).json()[0]      # beta's
    browser.get(f"{url}/console/login")
    browser.execute_script("sessionStorage.clear()")
    errors(browser)                 # what the tests before left in the log
    log_in(browser, url, alpha)
    wait(browser, lambda d: "vm1" in cell_texts(d, "ports"), "alpha's ports")
    shown = " ".join(cell_texts(browser, "ports") + cell_texts(browser, "networks"))
    assert "red1" not in shown and "red" not in cell_texts(browser, "networks") and "beta" not in shown
    assert not browser.find_element(By.ID, "infra-section").is_displayed()       # nodes: admin only
    assert errors(browser) == []
    shot(browser, "member")
    # beta's port by its URL: the API says it does not exist, and nothing of it is shown
    browser.get(f"{url}/console/port/{red1['id']}")
    wait(browser, lambda d: "does not exist" in d.find_element(By.ID, "error").text, "the refusal")
    assert red1["mac_address"] not in browser.find_element(By.TAG_NAME, "body").text
    # the data calls themselves, with the page's token
    status = browser.execute_script(
        "const r = await fetch('/v1/ports/' + arguments[0], {headers: {Authorization: 'Bearer ' + sessionStorage.getItem('fathom.token')}});"
        "return r.status;", red1["id"])
    assert status == 404
    names = browser.execute_script(
        "const r = await fetch('/v1/ports', {headers: {Authorization: 'Bearer ' + sessionStorage.getItem('fathom.token')}});"
        "return (await r.json()).map(p => p.project_id);")
    assert set(names) == {"alpha"}
    # the topology's summary: alpha's ports counted, on the nodes by name, no node's health
    summary = browser.execute_script(
        "const r = await fetch('/v1/topology', {headers: {Authorization: 'Bearer ' + sessionStorage.getItem('fathom.token')}});"
        "return await r.json();")
    alpha_ports = [p for p in admin.get("/ports").json() if p["project_id"] == "alpha" and p["node"]]
    assert sum(sum(n["ports"].values()) for n in summary["nodes"]) == len(alpha_ports)
    assert all(set(n) == {"name", "ports"} for n in summary["nodes"])
    errors(browser)    # the refused calls above are logged as failed loads: expected here


def test_change_notices_are_filtered_per_project(admin, url):
    """A member's stream of change notices hears of its project's port, not of another project's."""
    alpha = token_of(admin, "alpha")["token"]
    lines: list[str] = []

    def listen():   # until 3 s pass with nothing on the stream
        try:
            with httpx.stream("GET", f"{url}/v1/events", headers={"Authorization": f"Bearer {alpha}"},
                              timeout=httpx.Timeout(10, read=3)) as r:
                for line in r.iter_lines():
                    lines.append(line)
        except httpx.ReadTimeout:
            pass
    reader = threading.Thread(target=listen)
    reader.start()
    nets = {n["name"]: n["id"] for n in admin.get("/networks").json()}
    made = []
    try:
        deadline = time.monotonic() + 10
        while "event: hello" not in lines and time.monotonic() < deadline:
            time.sleep(0.05)
        made.append(admin.post("/ports", json={"network_id": nets["red"], "name": "qf-beta", "project_id": "beta"}).json())
        admin.get(f"/ports/{made[-1]['id']}", params={"wait": "down", "timeout": 10})    # its pass is over
        time.sleep(0.5)
        assert not any(line.startswith("event: change") for line in lines), lines
        made.append(admin.post("/ports", json={"network_id": nets["blue"], "name": "qf-alpha", "project_id": "alpha"}).json())
        reader.join(20)
        assert "event: change" in lines and any('"port"' in line for line in lines), lines
    finally:
        for port in made:
            admin.delete(f"/ports/{port['id']}")


def test_bad_or_revoked_token_goes_back_to_login(lab, admin, url, browser):
    browser.get(f"{url}/console/login")
    browser.execute_script("sessionStorage.setItem('fathom.token', 'fathom_not-a-token')")
    browser.get(f"{url}/console/topology")
    wait(browser, lambda d: d.current_url.startswith(f"{url}/console/login?next="), "the login page")
    assert browser.execute_script("return sessionStorage.getItem('fathom.token')") is None
    assert not browser.find_elements(By.CSS_SELECTOR, "td")
    # a revoked token: refused at the next call
    made = token_of(admin, "alpha")
    log_in(browser, url, made["token"])
    wait(browser, lambda d: "vm1" in cell_texts(d, "ports"), "alpha's ports")
    assert admin.delete(f"/tokens/{made['id']}").status_code == 204
    browser.refresh()
    wait(browser, lambda d: d.current_url.startswith(f"{url}/console/login"), "the login page after revocation")
    # a wrong token typed in: stays on the login page, says so
    browser.find_element(By.ID, "token").send_keys("fathom_wrong")
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(browser, lambda d: "unknown, expired or revoked" in d.find_element(By.ID, "error").text, "the refusal")
    shot(browser, "login")
    errors(browser)


def test_keystone_login_member_sees_its_project_wrong_password_revoked(lab, admin, url, browser, keystone):
    """Credentials on the login page: the controller gets a project-scoped token from the real
    Keystone; its member sees its project only; a wrong password is said; the token revoked in
    Keystone sends the page back to the login page."""
    project = keystone.add_member("cs-ks", "cs-alice", KEYSTONE_PASSWORD)
    net = admin.post("/networks", json={"name": "cs-ks-net", "project_id": project})
    assert net.status_code == 201, net.text
    port = admin.post("/ports", json={"network_id": net.json()["id"], "name": "cs-ks-port", "project_id": project})
    assert port.status_code == 201, port.text
    try:
        browser.get(f"{url}/console/login")
        browser.execute_script("sessionStorage.clear()")
        browser.get(f"{url}/console/login?next=/console/topology")
        wait(browser, lambda d: d.find_element(By.ID, "keystone-login").is_displayed(), "the Keystone form")
        errors(browser)

        def submit(password: str) -> None:
            for field, value in (("ks-user", "cs-alice"), ("ks-password", password), ("ks-project", "cs-ks")):
                browser.find_element(By.ID, field).clear()
                browser.find_element(By.ID, field).send_keys(value)
            browser.find_element(By.CSS_SELECTOR, "#keystone-login button[type=submit]").click()
        submit("not-" + KEYSTONE_PASSWORD)
        wait(browser, lambda d: "Keystone refused" in d.find_element(By.ID, "ks-error").text, "the refusal")
        assert browser.execute_script("return sessionStorage.getItem('fathom.token')") is None
        shot(browser, "login-keystone")
        errors(browser)          # the refused call is logged as a failed load: expected here
        started = time.monotonic()
        submit(KEYSTONE_PASSWORD)
        wait(browser, lambda d: d.current_url == f"{url}/console/topology", "the topology")
        wait(browser, lambda d: "cs-ks-port" in cell_texts(d, "ports"), "the project's port")
        print(f"keystone login to the topology shown: {time.monotonic() - started:.1f} s")
        shown = " ".join(cell_texts(browser, "ports") + cell_texts(browser, "networks"))
        assert "vm1" not in shown and "red" not in cell_texts(browser, "networks")
        token = browser.execute_script("return sessionStorage.getItem('fathom.token')")
        who = httpx.get(f"{url}/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json()
        assert who == {"project": project, "admin": False, "roles": ["member"]}
        assert errors(browser) == []
        # the password is in no log of the controller's
        assert KEYSTONE_PASSWORD not in (lab.dir / "controller.log").read_text(errors="replace")
        # revoked in Keystone: refused once the controller's validation of it is older than its cache
        keystone.revoke(token)
        time.sleep(KEYSTONE_CACHE_SECONDS + 0.5)
        browser.refresh()
        wait(browser, lambda d: d.current_url.startswith(f"{url}/console/login"), "the login page after revocation")
        assert browser.execute_script("return sessionStorage.getItem('fathom.token')") is None
        errors(browser)
    finally:
        admin.delete(f"/ports/{port.json()['id']}")
        admin.delete(f"/networks/{net.json()['id']}")
