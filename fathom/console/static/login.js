// The login page: a token is tried on /v1/whoami, kept in this tab's sessionStorage, and the user
// goes on to the page that sent them here (a console path only). Where the controller validates
// Keystone tokens (GET /v1/login), Keystone credentials too: the controller asks Keystone for a
// project-scoped token (POST /v1/login/keystone), which the tab keeps the same way.
function enter(token) {
  sessionStorage.setItem("fathom.token", token);
  const next = new URLSearchParams(location.search).get("next") || "";
  location.replace(/^\/console\/[a-z-]+(\/[0-9]+)?(\?[\w.=&%+-]*)?$/.test(next) ? next : "/console/topology");
}

document.getElementById("login").addEventListener("submit", async ev => {
  ev.preventDefault();
  const t = document.getElementById("token").value.trim();
  const r = await fetch("/v1/whoami", { headers: { Authorization: "Bearer " + t } });
  if (!r.ok) {
    document.getElementById("error").textContent =
      r.status === 401 ? "This token is unknown, expired or revoked." : "The controller answered " + r.status + ".";
    return;
  }
  enter(t);
});

const keystone = document.getElementById("keystone-login");
keystone.addEventListener("submit", async ev => {
  ev.preventDefault();
  const field = id => document.getElementById(id).value;
  const password = document.getElementById("ks-password");
  const error = document.getElementById("ks-error");
  error.textContent = "";
  const r = await fetch("/v1/login/keystone", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ user: field("ks-user").trim(), password: password.value,
                           project: field("ks-project").trim(), domain: field("ks-domain").trim() }),
  });
  password.value = "";
  if (r.ok) return enter((await r.json()).token);
  const said = await r.json().catch(() => null);
  error.textContent = r.status === 401 ? "Keystone refused this user name, password or project."
    : r.status === 429 ? "Too many attempts: wait a minute and try again."
    : "The controller answered " + r.status + (said && said.detail ? ": " + said.detail.map(d => d.msg).join("; ") : ".");
});

fetch("/v1/login").then(r => r.json()).then(m => { keystone.hidden = !m.methods.includes("keystone"); }).catch(() => {});
