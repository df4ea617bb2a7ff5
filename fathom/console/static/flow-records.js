// Flow records (GET /v1/flow-records): top talkers and drops by rule over the last 5 minutes, of
// the caller's project (the API filters; an admin sees every project's), read again every 10 s:
// records arrive with each node's export interval, not with change notices.
import { api, el, header, replace, showError, table } from "/console/static/console.js";

const PROTOCOLS = { 1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6" };
const EMPTY = "no records in the last 5 minutes (is sampling on? fathom flow-records config)";
const port = r => r.port || (r.port_id ? "port " + r.port_id : "");
let me;

async function refresh() {
  const [top, drops] = await Promise.all([api("/flow-records?view=top&limit=50"), api("/flow-records?view=drops&limit=50")]);
  const project = me.admin ? [{ title: "project", cell: r => r.project }] : [];
  replace("top", table([...project,
    { title: "port", cell: port }, { title: "source", cell: r => r.src }, { title: "destination", cell: r => r.dst },
    { title: "protocol", cell: r => PROTOCOLS[r.proto] || String(r.proto) }, { title: "to port", cell: r => r.dport || "" },
    { title: "bytes", cell: r => r.bytes.toLocaleString() }, { title: "packets", cell: r => r.packets.toLocaleString() },
  ], top.records, EMPTY));
  replace("drops", table([...project,
    { title: "port", cell: port }, { title: "rule", cell: r => r.rule === null ? "" : String(r.rule) },
    { title: "kind", cell: r => r.kind }, { title: "packets", cell: r => r.packets.toLocaleString() },
    { title: "bytes", cell: r => r.bytes.toLocaleString() },
  ], drops.records, EMPTY));
  // replicas of the cluster that did not answer: their records are missing (the API names them)
  const missing = [...new Set([...(top.partial || []), ...(drops.partial || [])])];
  replace("note", `read ${new Date().toLocaleTimeString()}; counts are scaled by each port's sampling rate` +
    (missing.length ? `; partial, without the records of replica ${missing.join("; ")}` : ""));
}

header().then(async who => {
  me = who;
  await refresh();
  setInterval(() => refresh().then(() => showError(null), showError), 10000);
}).catch(showError);
