// The runs list: newest first, filtered by status and flow and searched by run id (its start) and
// error text, a page at a time (the API's keyset cursors), refreshed every few seconds while the tab
// is visible. The filter is in the address, so a search can be shared.

import { allItems, api, ApiError } from "./api.js";
import { h, replaceChildren, uid } from "./dom.js";
import { ago, cost, datetime, duration, preview } from "./format.js";

// "interrupted": stored as running, but no process executes it (the API lists it apart from "running").
export const STATUSES = ["queued", "running", "interrupted", "paused", "waiting", "completed", "failed", "aborted"];
const PAGE_SIZE = 25;
const REFRESH_MS = 2000;

export function statusBadge(status) {
  const node = status === "completed" ? "done" : status;
  return h("span", { class: `badge st-${node}` }, status);
}

export function runLink(runId, text = runId) {
  return h("a", { href: `#/runs/${encodeURIComponent(runId)}`, class: "run-link" }, text);
}

export class RunsPage {
  constructor(params) {
    this.params = params;
    this.older = []; // cursors of the pages before this one, for "Newer"
    this.timer = null;
    this.disposed = false;
    this.flowNames = new Set();
    const statusId = uid("status");
    const flowId = uid("flow");
    this.statusSelect = h("select", { id: statusId, name: "status" }, h("option", { value: "" }, "any status"),
      STATUSES.map((s) => h("option", { value: s }, s)));
    this.flowSelect = h("select", { id: flowId, name: "flow" }, h("option", { value: "" }, "any flow"));
    this.statusSelect.addEventListener("change", () => this.filter());
    this.flowSelect.addEventListener("change", () => this.filter());
    const idId = uid("run-id");
    const errorId = uid("error");
    this.idInput = h("input", { id: idId, name: "run", type: "search", placeholder: "run_…", autocomplete: "off",
      spellcheck: "false", maxlength: 100 });
    this.errorInput = h("input", { id: errorId, name: "error", type: "search", placeholder: "text in the error",
      autocomplete: "off", maxlength: 500 });
    for (const input of [this.idInput, this.errorInput]) {
      input.addEventListener("change", () => this.filter()); // Enter, or leaving the field
      input.addEventListener("search", () => this.filter()); // the clear button
    }
    this.updated = h("span", { class: "updated", "aria-live": "off" });
    this.newer = h("button", { type: "button", onclick: () => this.go(this.older.pop() ?? null, false) }, "← Newer");
    this.newest = h("button", { type: "button", onclick: () => { this.older = []; this.go(null, false); } }, "Newest");
    this.olderButton = h("button", { type: "button", onclick: () => this.go(this.next, true) }, "Older →");
    this.tbody = h("tbody");
    this.message = h("div", { class: "page-message", role: "status" });
    this.element = h("div", { class: "runs-page" },
      h("div", { class: "page-head" }, h("h1", {}, "Runs"), this.updated),
      h("form", { class: "filters", role: "search", "aria-label": "filter runs",
        onsubmit: (e) => { e.preventDefault(); this.filter(); } },
        h("span", { class: "filter" }, h("label", { for: statusId }, "Status"), this.statusSelect),
        h("span", { class: "filter" }, h("label", { for: flowId }, "Flow"), this.flowSelect),
        h("span", { class: "filter" }, h("label", { for: idId }, "Run id"), this.idInput),
        h("span", { class: "filter" }, h("label", { for: errorId }, "Error"), this.errorInput),
        h("button", { type: "submit" }, "Search")),
      this.message,
      h("div", { class: "table-scroll" }, h("table", { class: "runs" },
        h("caption", { class: "visually-hidden" }, "Runs, newest first"),
        h("thead", {}, h("tr", {}, ["Status", "Run", "Flow", "Created", "Duration", "Cost", "Parent", "Error"]
          .map((c) => h("th", { scope: "col", class: c === "Duration" || c === "Cost" ? "num" : null }, c)))),
        this.tbody)),
      h("nav", { class: "pager", "aria-label": "pages of runs" }, this.newest, this.newer, this.olderButton));
    this.applyParams(params);
  }

  applyParams(params, inputs = true) {
    this.params = params;
    const flow = params.get("flow") || "";
    this.addFlowOption(flow);
    if (inputs) { // not after a search of our own: the fields may hold what was typed since
      this.statusSelect.value = params.get("status") || "";
      this.flowSelect.value = flow;
      this.idInput.value = params.get("run") || "";
      this.errorInput.value = params.get("error") || "";
    }
    this.cursor = params.get("cursor") || null;
    const limit = Number.parseInt(params.get("limit") || "", 10);
    this.limit = Number.isInteger(limit) && limit >= 1 && limit <= 500 ? limit : PAGE_SIZE;
    this.newer.disabled = !this.cursor;
    this.newest.disabled = !this.cursor;
  }

  addFlowOption(name) {
    if (!name || this.flowNames.has(name)) return;
    this.flowNames.add(name);
    const options = [...this.flowSelect.options].slice(1);
    const before = options.find((o) => o.value.localeCompare(name) > 0) || null;
    this.flowSelect.insertBefore(h("option", { value: name }, name), before);
  }

  hash(cursor) {
    const q = new URLSearchParams();
    if (this.statusSelect.value) q.set("status", this.statusSelect.value);
    if (this.flowSelect.value) q.set("flow", this.flowSelect.value);
    if (this.idInput.value.trim()) q.set("run", this.idInput.value.trim());
    if (this.errorInput.value.trim()) q.set("error", this.errorInput.value.trim());
    if (this.limit !== PAGE_SIZE) q.set("limit", String(this.limit));
    if (cursor) q.set("cursor", cursor);
    const text = q.toString();
    return `#/${text ? `?${text}` : ""}`;
  }

  filter() {
    const hash = this.hash(null);
    if (location.hash === hash) return;
    this.older = [];
    this.navigate(hash);
  }

  go(cursor, forward) {
    if (forward) this.older.push(this.cursor);
    this.navigate(this.hash(cursor));
  }

  navigate(hash) {
    this.own = hash; // the address this page set from its own fields
    location.hash = hash;
  }

  update(params) {
    // A hashchange arrives after the event that set it: by then the user may have typed into another
    // field. An address this page set itself leaves the fields alone; any other (a link, Back) fills them.
    const own = this.own !== undefined && location.hash === this.own;
    this.applyParams(params, !own);
    this.refresh();
    return true;
  }

  async start() {
    allItems("/flows").then((flows) => flows.forEach((f) => this.addFlowOption(f.name))).catch(() => {});
    await this.refresh();
  }

  async refresh() {
    clearTimeout(this.timer);
    if (this.disposed) return;
    const query = { status: this.statusSelect.value, flow: this.flowSelect.value, cursor: this.cursor, limit: this.limit,
      runIdPrefix: this.params.get("run") || "", error: this.params.get("error") || "" };
    this.asked = (this.asked || 0) + 1;
    const asked = this.asked;
    try {
      const page = await api("/runs", { query });
      if (this.disposed || asked !== this.asked) return; // a newer request (other filters) answers instead
      this.render(page);
      replaceChildren(this.message);
      this.updated.textContent = `updated ${datetime(Date.now()).slice(11)}`;
    } catch (error) {
      if (this.disposed) return;
      replaceChildren(this.message, h("p", { class: "error-text" },
        error instanceof ApiError ? `Could not list runs: ${error.message}` : String(error)));
    }
    if (!this.disposed) this.timer = setTimeout(() => this.tick(), REFRESH_MS);
  }

  tick() {
    if (document.hidden) {
      this.timer = setTimeout(() => this.tick(), REFRESH_MS);
      return;
    }
    this.refresh();
  }

  render(page) {
    this.next = page.nextCursor;
    this.olderButton.disabled = !page.nextCursor;
    const focused = document.activeElement && this.tbody.contains(document.activeElement)
      ? document.activeElement.closest("tr")?.dataset.run : null;
    const now = Date.now();
    const rows = page.items.map((run) => {
      this.addFlowOption(run.flowName);
      const running = run.completedAt === null;
      return h("tr", { dataset: { run: run.runId, status: run.status } },
        h("td", {}, statusBadge(run.status)),
        h("td", {}, runLink(run.runId)),
        h("td", {}, run.flowName),
        h("td", {}, h("time", { datetime: new Date(run.createdAt).toISOString(), title: ago(run.createdAt, now) },
          datetime(run.createdAt))),
        h("td", { class: "num" }, running ? h("span", { class: "ongoing", title: "so far" }, `${duration(now - run.createdAt)}…`)
          : duration(run.durationMs)),
        h("td", { class: "num" }, cost(run.totalCostUsd)),
        h("td", {}, run.parentRunId ? runLink(run.parentRunId) : "—"),
        h("td", { class: "error-cell" }, run.error ? h("span", { title: run.error }, preview(run.error, 200)) : ""));
    });
    if (!rows.length) {
      const filtered = this.statusSelect.value || this.flowSelect.value || this.params.get("run") || this.params.get("error");
      rows.push(h("tr", {}, h("td", { colspan: 8, class: "empty" }, filtered ? "No run matches these filters."
        : ["No runs yet. Start one from ", h("a", { href: "#/flows" }, "Flows"),
          ", with `flowkernel run FLOW --queue`, or POST /api/v1/runs."])));
    }
    replaceChildren(this.tbody, rows);
    if (focused) this.tbody.querySelector(`tr[data-run="${CSS.escape(focused)}"] a`)?.focus();
  }

  dispose() {
    this.disposed = true;
    clearTimeout(this.timer);
  }
}
