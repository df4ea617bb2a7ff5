// The login page: a token is tried on /v1/whoami, kept in this tab's sessionStorage, and the user
// goes on to the page that sent them here (a console path only).
const form = document.getElementById("login");
form.addEventListener("submit", async ev => {
  ev.preventDefault();
  const t = document.getElementById("token").value.trim();
  const r = await fetch("/v1/whoami", { headers: { Authorization: "Bearer " + t } });
  if (!r.ok) {
    document.getElementById("error").textContent =
      r.status === 401 ? "This token is unknown, expired or revoked." : "The controller answered " + r.status + ".";
    return;
  }
  sessionStorage.setItem("fathom.token", t);
  const next = new URLSearchParams(location.search).get("next") || "";
  location.replace(/^\/console\/[a-z-]+(\/[0-9]+)?(\?[\w.=&%+-]*)?$/.test(next) ? next : "/console/topology");
});
