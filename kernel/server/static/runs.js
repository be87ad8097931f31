// The runs list: newest first, filtered by status and flow, a page at a time (the API's keyset
// cursors), refreshed every few seconds while the tab is visible.

import { allItems, api, ApiError } from "./api.js";
import { h, replaceChildren, uid } from "./dom.js";
import { ago, cost, datetime, duration } from "./format.js";

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
    this.updated = h("span", { class: "updated", "aria-live": "off" });
    this.newer = h("button", { type: "button", onclick: () => this.go(this.older.pop() ?? null, false) }, "← Newer");
    this.newest = h("button", { type: "button", onclick: () => { this.older = []; this.go(null, false); } }, "Newest");
    this.olderButton = h("button", { type: "button", onclick: () => this.go(this.next, true) }, "Older →");
    this.tbody = h("tbody");
    this.message = h("div", { class: "page-message", role: "status" });
    this.element = h("div", { class: "runs-page" },
      h("div", { class: "page-head" }, h("h1", {}, "Runs"), this.updated),
      h("form", { class: "filters", role: "search", "aria-label": "filter runs", onsubmit: (e) => e.preventDefault() },
        h("label", { for: statusId }, "Status"), this.statusSelect,
        h("label", { for: flowId }, "Flow"), this.flowSelect),
      this.message,
      h("div", { class: "table-scroll" }, h("table", { class: "runs" },
        h("caption", { class: "visually-hidden" }, "Runs, newest first"),
        h("thead", {}, h("tr", {}, ["Status", "Run", "Flow", "Created", "Duration", "Cost", "Parent"]
          .map((c) => h("th", { scope: "col", class: c === "Duration" || c === "Cost" ? "num" : null }, c)))),
        this.tbody)),
      h("nav", { class: "pager", "aria-label": "pages of runs" }, this.newest, this.newer, this.olderButton));
    this.applyParams(params);
  }

  applyParams(params) {
    this.params = params;
    this.statusSelect.value = params.get("status") || "";
    const flow = params.get("flow") || "";
    this.addFlowOption(flow);
    this.flowSelect.value = flow;
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
    if (this.limit !== PAGE_SIZE) q.set("limit", String(this.limit));
    if (cursor) q.set("cursor", cursor);
    const text = q.toString();
    return `#/${text ? `?${text}` : ""}`;
  }

  filter() {
    this.older = [];
    location.hash = this.hash(null);
  }

  go(cursor, forward) {
    if (forward) this.older.push(this.cursor);
    location.hash = this.hash(cursor);
  }

  update(params) {
    this.applyParams(params);
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
    const query = { status: this.statusSelect.value, flow: this.flowSelect.value, cursor: this.cursor, limit: this.limit };
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
        h("td", {}, run.parentRunId ? runLink(run.parentRunId) : "—"));
    });
    if (!rows.length) {
      const filtered = this.statusSelect.value || this.flowSelect.value;
      rows.push(h("tr", {}, h("td", { colspan: 7, class: "empty" }, filtered ? "No run matches these filters."
        : "No runs yet. Start one with `flowkernel run FLOW` or POST /api/v1/runs.")));
    }
    replaceChildren(this.tbody, rows);
    if (focused) this.tbody.querySelector(`tr[data-run="${CSS.escape(focused)}"] a`)?.focus();
  }

  dispose() {
    this.disposed = true;
    clearTimeout(this.timer);
  }
}
