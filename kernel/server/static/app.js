// The web UI's entry point: hash routes (#/ the runs list, #/runs/RUN?at=SEQ a run, #/flows the
// flows and their start forms, #/workers the workers and the queue), the token prompt, and the
// server's version in the top bar. Hash routes keep serving to one static mount.

import { ApiError, api, forgetToken, hasToken, setTokenPrompt } from "./api.js";
import { h, replaceChildren } from "./dom.js";
import { FlowsPage } from "./flows.js";
import { RunPage } from "./run.js";
import { RunsPage } from "./runs.js";
import { WorkersPage } from "./workers.js";

const main = document.getElementById("main");
let page = null;

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const cut = raw.indexOf("?");
  const path = cut < 0 ? raw : raw.slice(0, cut);
  return { path, params: new URLSearchParams(cut < 0 ? "" : raw.slice(cut + 1)) };
}

/** The page for an address: [key, make(), title]. */
function pageFor(path, params) {
  const run = path.match(/^\/runs\/([^/]+)\/?$/);
  if (run) {
    const id = decodeURIComponent(run[1]);
    return [`run:${id}`, () => new RunPage(id, params), `${id} · flowkernel`];
  }
  const flow = path.match(/^\/flows(?:\/([^/]+))?\/?$/);
  if (flow) return ["flows", () => new FlowsPage(params, flow[1] ? decodeURIComponent(flow[1]) : null), "Flows · flowkernel"];
  if (/^\/workers\/?$/.test(path)) return ["workers", () => new WorkersPage(params), "Workers · flowkernel"];
  return ["runs", () => new RunsPage(params), "Runs · flowkernel"];
}

function route() {
  const { path, params } = parseHash();
  const [key, make, title] = pageFor(path, params);
  for (const link of document.querySelectorAll("nav[aria-label=main] a")) {
    if (link.dataset.page === key.split(":")[0]) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (page && page.key === key && page.update(params, path)) return;
  if (page) page.dispose();
  page = make();
  page.key = key;
  replaceChildren(main, page.element);
  document.title = title;
  page.start();
}

function askForToken(message) {
  const dialog = document.getElementById("token-dialog");
  const form = document.getElementById("token-form");
  const input = document.getElementById("token-input");
  document.getElementById("token-message").textContent = message;
  input.value = "";
  return new Promise((resolve, reject) => {
    const done = () => {
      form.removeEventListener("submit", submitted);
      dialog.removeEventListener("cancel", cancelled);
    };
    const submitted = (event) => {
      event.preventDefault();
      if (!input.value) return;
      done();
      dialog.close();
      resolve(input.value);
    };
    const cancelled = () => {
      done();
      reject(new ApiError(401, { title: "Unauthorized", detail: "this server needs its API token; reload the page to enter it" }));
    };
    form.addEventListener("submit", submitted);
    dialog.addEventListener("cancel", cancelled);
    dialog.showModal();
    input.focus();
  });
}

async function serverInfo() {
  const info = document.getElementById("server-info");
  try {
    const health = await api("/health");
    replaceChildren(info, `flowkernel ${health.version} · ${health.store}`);
  } catch (error) {
    replaceChildren(info, h("span", { class: "error-text" }, `server unreachable: ${error.message}`));
  }
  if (hasToken()) {
    info.append(" ", h("button", { type: "button", class: "link", onclick: () => { forgetToken(); location.reload(); } },
      "forget token"));
  }
}

setTokenPrompt(askForToken);
window.addEventListener("hashchange", route);
route();
serverInfo();
