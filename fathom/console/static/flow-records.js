// Flow records (GET /v1/flow-records): top talkers and drops by rule over the last 5 minutes, of
// the caller's project (the API filters; an admin sees every project's), read again every 10 s:
// records arrive with each node's export interval, not with change notices. Above them the sampling
// rates the caller may see (GET /v1/flow-records/config) and a form that sets a project's or a
// port's (PUT): the API decides who may (a member: its own project, at most one in 100 packets on
// ingress and admit; an admin: any), and its refusal is shown as it answers, status and reason.
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

async function readRates() {
  replace("rates", table([
    { title: "project", cell: r => r.project_id }, { title: "port", cell: r => r.port_id === null ? "(project)" : String(r.port_id) },
    { title: "ingress", cell: r => String(r.ingress) }, { title: "admit", cell: r => String(r.admit) },
    { title: "drop", cell: r => String(r.drop) },
  ], await api("/flow-records/config"), "no rates set: sampling is off"));
}

async function setRates(event) {
  event.preventDefault();
  const value = id => document.getElementById(id).value;
  const body = { ingress: Number(value("rate-ingress")), admit: Number(value("rate-admit")), drop: Number(value("rate-drop")) };
  if (value("rate-port")) body.port_id = Number(value("rate-port")); else body.project_id = value("rate-project");
  const result = document.getElementById("rate-result");
  try {
    const set = await api("/flow-records/config", { method: "PUT", body });
    result.className = "";
    replace("rate-result", `set: ${set.port_id === null ? "project " + set.project_id : "port " + set.port_id}, ` +
      `ingress ${set.ingress}, admit ${set.admit}, drop ${set.drop}`);
    await readRates();
  } catch (e) {
    result.className = "refused";
    replace("rate-result", `refused (${e.status}): ${e.message}`);
  }
}

header().then(async who => {
  me = who;
  document.getElementById("rate-project").value = me.project;
  document.getElementById("sampling").addEventListener("submit", setRates);
  await readRates();
  await refresh();
  setInterval(() => refresh().then(() => showError(null), showError), 10000);
}).catch(showError);
