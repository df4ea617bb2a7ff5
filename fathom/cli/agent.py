"""`fathom agent`: the node agent (`run`) and its progress (`status`)."""
from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path

import click


def fail(msg: str):
    from fathom.cli.output import fail as _fail
    _fail(msg)


class _AgentGroup(click.Group):
    """`list` and `show` call the API (fathom.cli.agent_api): loaded only for them, so that `run`,
    the agent on every node, stays small."""
    API_COMMANDS = ("list", "show")

    def list_commands(self, ctx):
        return sorted({*self.commands, *self.API_COMMANDS})

    def get_command(self, ctx, name):
        if name in self.API_COMMANDS and name not in self.commands:
            from fathom.cli.agent_api import commands
            self.add_command(commands.commands[name])
        return super().get_command(ctx, name)


@click.group(cls=_AgentGroup)
def agent():
    """The node agent: follows this node's host-local desired state (network-node routers, PPTMon
    attachments), reports its facts and statuses, and delivers its PPTMon records."""


@agent.command("run")
@click.option("--controller", envvar="FATHOM_CONTROLLER", default="http://127.0.0.1:8080", show_default=True,
              help="URL of the fathom controller (env FATHOM_CONTROLLER).")
@click.option("--node", default=None, help="this node's name (default: the host name)")
@click.option("--root", default=None, help="where the loaders write (default /run/fathom/pptmon)")
@click.option("--chain", "chains", multiple=True, help="only these chains (repeatable; default all)")
@click.option("--state-dir", default=None, help="checkpoint and status (default /run/fathom/agent)")
@click.option("--batch", default=500, show_default=True, help="records per POST (max 1000)")
@click.option("--buffer", default=20_000, show_default=True, help="records held in memory at most")
@click.option("--overflow", type=click.Choice(["pause", "drop-oldest"]), default="pause", show_default=True,
              help="full buffer: stop reading (files keep the backlog) or drop the oldest (counted)")
@click.option("--flush", default=1.0, show_default=True, help="send a partial batch after this many seconds")
@click.option("--poll", default=0.2, show_default=True, help="seconds between looks at the files")
@click.option("--backoff-max", default=30.0, show_default=True, help="longest wait between retries (s)")
@click.option("--log-interval", default=10.0, show_default=True, help="seconds between progress lines")
@click.option("--token-file", envvar="FATHOM_TOKEN_FILE", default=None,
              help="this node's agent token (`fathom token create --role agent --node N`); or env FATHOM_TOKEN")
@click.option("--ovsdb", default="unix:/var/run/openvswitch/db.sock", show_default=True,
              help="this node's OVSDB (local socket)")
@click.option("--router-ns-prefix", default="fathom-r", show_default=True,
              help="network-node router namespaces are <prefix><router id>")
@click.option("--dhcp-ns-prefix", default="fathom-d", show_default=True,
              help="DHCP server namespaces are <prefix><network id>")
@click.option("--tunnel-address", envvar="FATHOM_TUNNEL_ADDRESS", default=None,
              help="this node's tunnel address with its prefix (198.18.0.11/24), kept on br-phy across a "
                   "change of its datapath type (env FATHOM_TUNNEL_ADDRESS)")
@click.option("--records-only", is_flag=True, help="only deliver PPTMon records (no host-local state)")
@click.option("--flow-records-port", default=4739, show_default=True,
              help="UDP port on 127.0.0.1 where this node's OVS sends IPFIX flow samples (0: no flow records)")
@click.option("--flow-records-interval", default=5.0, show_default=True,
              help="seconds of samples added up into one record per flow")
@click.option("--cacert", envvar="FATHOM_CACERT", default=None, type=click.Path(exists=True, dir_okay=False),
              help="CA certificate of the controller's HTTPS endpoint (a TLS-terminating proxy), env FATHOM_CACERT")
def run(controller, node, root, chains, state_dir, batch, buffer, overflow, flush, poll, backoff_max,
        log_interval, token_file, ovsdb, router_ns_prefix, dhcp_ns_prefix, tunnel_address, records_only, cacert,
        flow_records_port, flow_records_interval):
    """Run the node agent (foreground): follow the node's host-local desired state from the
    controller and report; deliver the PPTMon loaders' records."""
    import threading

    from fathom.agent.agent import Agent, AgentError
    from fathom.agent.capture import Capturer
    from fathom.agent.datapath import DatapathFlushes
    from fathom.agent.dhcp import DhcpServers
    from fathom.agent.follow import Follower
    from fathom.agent.http import JsonClient
    from fathom.agent.local import LocalOvs, facts
    from fathom.agent.pptmon import Pptmon
    from fathom.agent.routers import Routers
    from fathom.agent.trace import Tracer
    from fathom.pptmon.control import BPFFS

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from fathom.auth.client import NoToken, bearer, read_token_file, resolve_token
    try:
        token = read_token_file(token_file) if token_file else resolve_token()
        a = Agent(controller, root=root, chains=list(chains) or None, node=node, batch=batch, buffer=buffer,
                  overflow=overflow, flush=flush, poll=poll, backoff_max=backoff_max, state_dir=state_dir,
                  log_interval=log_interval, headers=bearer(token), verify=cacert or True)
        from fathom.agent.underlay import TunnelAddress
        underlay = TunnelAddress(tunnel_address) if tunnel_address else None
    except (ValueError, NoToken) as e:
        fail(str(e))
    stopping = threading.Event()
    follower = flows = routes = None
    if not records_only:
        ovs = LocalOvs(ovsdb)
        http = JsonClient(a.controller, headers=bearer(token), timeout=30, verify=cacert or True)
        # the datapath flush first: until it is done, traffic may take a router's old path
        handlers = [DatapathFlushes(ovs), Routers(ovs, router_ns_prefix), Pptmon(a.root, a.state_dir, BPFFS, a.node),
                    DhcpServers(ovs, a.state_dir, dhcp_ns_prefix)]
        capturer = Capturer(ovs, JsonClient(a.controller, headers=bearer(token), timeout=30, verify=cacert or True),
                            a.node)
        tracer = Tracer(ovs)
        follower = Follower(http, a.node, handlers, lambda: facts(ovs), tracer=tracer, capturer=capturer)
        from fathom.agent.underlay import TunnelRoutes
        routes = TunnelRoutes(ovs.appctl)
        a.extra_status = follower.status
        if flow_records_port:
            from fathom.agent.flow_records import FlowRecords
            try:
                flows = FlowRecords(JsonClient(a.controller, headers=bearer(token), timeout=10, verify=cacert or True),
                                    ovs, port=flow_records_port, interval=flow_records_interval)
            except OSError as e:
                fail(f"flow records: cannot listen on 127.0.0.1:{flow_records_port}: {e}")
            a.extra_status = lambda: {**follower.status(), "flow_records": flows.status()}

    def stop(*_):
        stopping.set()
        a.stop()
        if follower:
            follower.stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    errors = []

    def records():
        try:
            a.run()
        except AgentError as e:
            errors.append(str(e))
            stop()
    t = threading.Thread(target=records, name="records")
    t.start()
    while t.is_alive() and not a.locked.wait(0.1):   # one agent per state directory, before any host work
        pass
    if underlay and a.locked.is_set():
        threading.Thread(target=underlay.run, args=(stopping,), name="underlay", daemon=True).start()
    if routes and a.locked.is_set():
        threading.Thread(target=routes.run, args=(stopping,), name="tunnel-routes", daemon=True).start()
    if flows and a.locked.is_set():
        threading.Thread(target=flows.run, args=(stopping,), name="flow-records", daemon=True).start()
    if follower and a.locked.is_set():
        follower.run()
        tracer.live.close()      # the live traces' watcher detaches its programs now, not at its idle time
    t.join()
    if errors:
        fail(errors[0])


@agent.command("status")
@click.option("--state-dir", default=None, help="the agent's --state-dir (default /run/fathom/agent)")
@click.option("--json", "as_json", is_flag=True)
def status(state_dir, as_json):
    """Progress and health of the agent on this node."""
    from fathom.agent.agent import STATE_DIR, STATUS_REFRESH
    from fathom.cli.output import print_json, print_table

    f = Path(state_dir or STATE_DIR) / "status.json"
    try:
        st = json.loads(f.read_text())
    except (OSError, ValueError):
        fail(f"no agent status at {f} (is `fathom agent run` running here?)")
    alive = _alive(st.get("pid")) and "stopped" not in st
    st["running"] = alive
    st["age_s"] = round(time.time() - st.get("updated", 0), 1)
    if as_json:
        return print_json(st)
    c = st.get("counters", {})
    state = "running" if alive else "stopped"
    if alive and st["age_s"] > 2 * STATUS_REFRESH:
        state = f"stale ({st['age_s']} s without an update)"
    rows = [["state", state], ["pid", st.get("pid")], ["node", st.get("node")],
            ["controller", st.get("controller")], ["files followed", st.get("files")],
            ["delivered", c.get("delivered")], ["duplicates (already stored)", c.get("duplicates")],
            ["buffered", f"{st.get('buffered')} / {st.get('buffer_max')} ({st.get('overflow')})"],
            ["lag", f"{st.get('lag_bytes')} bytes"],
            ["dropped: overflow / refused / invalid / not JSON",
             f"{c.get('dropped_overflow')} / {c.get('rejected')} / {c.get('invalid')} / {c.get('not_json')}"],
            ["files: rotations / truncations / partial lines dropped",
             f"{c.get('rotations')} / {c.get('truncations')} / {c.get('partial_dropped')}"],
            ["failures in a row", st.get("consecutive_failures")], ["next retry in", f"{st.get('backoff_s')} s"],
            ["last delivery", time.strftime("%H:%M:%S", time.localtime(st["last_delivery"]))
             if st.get("last_delivery") else "never"],
            ["last error", st.get("last_error") or ""]]
    hl = st.get("host_local") or {}
    if hl:
        objects = hl.get("objects") or {}
        bad = {k: v for k, v in objects.items() if v.get("status") != "active"}
        rows += [["host-local revision applied", hl.get("revision")],
                 ["host-local objects (not active)", f"{len(objects)} ({len(bad)})"],
                 *[[f"  {k}", f"{v.get('status')}: {v.get('reason') or ''}"] for k, v in sorted(bad.items())],
                 ["controller failures in a row", hl.get("failures")],
                 ["controller last error", hl.get("last_error") or ""]]
    print_table("fathom agent", ["", ""], rows)


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (OSError, TypeError, ValueError):
        return False
