// A port: its status and why, its counters (packets, bytes, drops, errors of its interface on its
// node's br-int, read every 2 s: GET /v1/ports/{id}/counters), the security groups and taps that
// apply, and its flows per stage on its node, desired against actual, with the difference marked
// (admin: the node's flows are an admin endpoint of the API).
import { api, apiMaybe, el, follow, header, replace, showError, statusBadge, table } from "/console/static/console.js";

const portId = Number(location.pathname.split("/").pop());
const KIND_PORT = 5n;   // fathom.pipeline.cookies: cookie = app << 56 | kind << 48 | object id

function cookieOf(flow) {
  const m = /cookie=(0x[0-9a-f]+)/.exec(flow);
  return m ? BigInt(m[1]) : 0n;
}
const ownedBy = (flow, id) => ((cookieOf(flow) >> 48n) & 0xffn) === KIND_PORT && (cookieOf(flow) & ((1n << 48n) - 1n)) === BigInt(id);

let me;

async function refresh() {
  const port = await api("/ports/" + portId);
  const network = await apiMaybe("/networks/" + port.network_id);
  replace("title", "Port ", el("span", {}, port.name || String(port.id)), " ",
    el("a", { id: "trace-link", href: "/console/trace?port=" + port.id }, "trace from this port"));
  replace("port", table([
    { title: "status", cell: p => statusBadge(p.status) }, { title: "why", cell: p => p.status_reason || "" },
    { title: "project", cell: p => p.project_id }, { title: "network", cell: () => network ? network.name : String(port.network_id) },
    { title: "addresses", cell: p => p.fixed_ips.map(f => f.ip_address).join(", ") },
    { title: "MAC", cell: p => p.mac_address }, { title: "node", cell: p => p.node || "(not bound)" },
    { title: "interface", cell: p => p.interface_name || "" },
    { title: "port security", cell: p => p.port_security ? "on" : "off" },
  ], [port]));
  const groups = (await Promise.all(port.security_groups.map(g => apiMaybe("/security-groups/" + g)))).filter(Boolean);
  replace("groups", groups.length ? groups.map(g => el("div", {},
    el("h3", {}, g.name, " ", statusBadge(g.status, g.status_reason)),
    table([
      { title: "direction", cell: r => r.direction }, { title: "ethertype", cell: r => r.ethertype },
      { title: "protocol", cell: r => r.protocol || "any" },
      { title: "ports", cell: r => r.port_range_min === null ? "any" : `${r.port_range_min}-${r.port_range_max}` },
      { title: "remote", cell: r => r.remote_ip_prefix || (r.remote_group_id !== null ? "group " + r.remote_group_id : "any") },
    ], g.rules, "no rules: nothing allowed in"))) : el("p", { class: "empty" }, port.port_security ? "none" : "port security off"));
  const taps = (await api("/taps")).filter(t => [t.sender, t.receiver, t.monitor, t.monitor2].some(e => e && e.port_id === port.id));
  const role = t => ["sender", "receiver", "monitor", "monitor2"].filter(k => t[k] && t[k].port_id === port.id).join(", ");
  replace("taps", table([
    { title: "tap", cell: t => t.name }, { title: "this port is", cell: role },
    { title: "direction", cell: t => t.direction }, { title: "status", cell: t => statusBadge(t.status, t.status_reason) },
  ], taps));
  if (!me.admin) return replace("flows", el("p", { class: "empty" }, "A node's flows are for admins (GET /v1/nodes/{node}/flows)."));
  if (!port.node) return replace("flows", el("p", { class: "empty" }, "not bound to a node"));
  const f = await api("/nodes/" + encodeURIComponent(port.node) + "/flows");
  if (f.actual === null) return replace("flows", el("p", {}, statusBadge("down"), " the switch of ", port.node, " is not connected"));
  const stages = [...new Set([...Object.keys(f.desired), ...Object.keys(f.actual)])];
  const rows = stages.map(stage => {
    const desired = (f.desired[stage] || []).filter(x => ownedBy(x, port.id));
    const actual = (f.actual[stage] || []).filter(x => ownedBy(x, port.id));
    const d = new Set(desired), a = new Set(actual);
    return { stage, desired, actual, missing: desired.filter(x => !a.has(x)), extra: actual.filter(x => !d.has(x)) };
  }).filter(r => r.desired.length || r.actual.length);
  const lines = (list, bad, cls) => el("pre", { class: "flows" }, list.map(x => el("div", { class: bad.includes(x) ? cls : "" }, x)));
  const differ = rows.reduce((n, r) => n + r.missing.length + r.extra.length, 0);
  replace("flows",
    el("p", {}, `node ${port.node}: ${differ ? differ + " flows differ (missing from the switch in red, not wanted in yellow)" : "desired and actual agree"}`),
    table([
      { title: "stage", cell: r => r.stage },
      { title: "desired", cell: r => lines(r.desired, r.missing, "missing") },
      { title: "actual", cell: r => lines(r.actual, r.extra, "extra") },
    ], rows, "no flows of this port"));
}

async function counters() {
  const c = await api("/ports/" + portId + "/counters");
  if (!c.counters) return replace("counters", el("p", { class: "empty" }, c.reason));
  const k = c.counters;
  replace("counters", table([
    { title: "", cell: r => r.dir }, { title: "packets", cell: r => String(r.packets) },
    { title: "bytes", cell: r => String(r.bytes) }, { title: "dropped", cell: r => String(r.dropped) },
    { title: "errors", cell: r => String(r.errors) },
  ], [
    { dir: "from the port (rx)", packets: k.rx_packets, bytes: k.rx_bytes, dropped: k.rx_dropped, errors: k.rx_errors },
    { dir: "to the port (tx)", packets: k.tx_packets, bytes: k.tx_bytes, dropped: k.tx_dropped, errors: k.tx_errors },
  ]), el("p", { id: "counters-read" }, `${c.interface} (OpenFlow port ${c.ofport}) on ${c.node}, read at `,
        el("time", { datetime: c.read_at }, new Date(c.read_at).toLocaleTimeString())));
}

// its port, its network, security groups, taps, a node's flows: read again
const concerns = ({ changes }) => changes.some(c => (c.kind === "port" && c.id === portId)
  || ["network", "security_group", "tap_policy", "node"].includes(c.kind));
header().then(who => {
  me = who;
  follow(refresh, concerns);
  counters().catch(showError);
  setInterval(() => counters().catch(showError), 2000);
}).catch(showError);
