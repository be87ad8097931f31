// Operations at a glance: the live workers of the store (GET /workers, what `flowkernel workers`
// shows: host, pid, heartbeat, runs held) and the queue (GET /runs?status=queued&order=oldest: the
// queued runs in the order workers claim them), refreshed every few seconds while the tab is visible.

import { api, ApiError } from "./api.js";
import { h, replaceChildren } from "./dom.js";
import { ago, datetime } from "./format.js";
import { runLink } from "./runs.js";

const REFRESH_MS = 2000;
const QUEUE_SHOWN = 100;

function table(caption, columns, rows, empty) {
  return h("div", { class: "table-scroll" }, h("table", {},
    h("caption", { class: "visually-hidden" }, caption),
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.num ? "num" : null }, c.label)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: columns.length, class: "empty" }, empty)))));
}

export class WorkersPage {
  constructor() {
    this.timer = null;
    this.disposed = false;
    this.workers = h("div", { class: "workers" });
    this.queue = h("div", { class: "queue" });
    this.updated = h("span", { class: "updated", "aria-live": "off" });
    this.message = h("div", { class: "page-message", role: "status" });
    this.queueCount = h("span", { class: "count-note" });
    this.element = h("div", { class: "workers-page" },
      h("div", { class: "page-head" }, h("h1", {}, "Workers"), this.updated),
      this.message,
      h("section", { "aria-labelledby": "workers-title" }, h("h2", { id: "workers-title" }, "Live workers"), this.workers),
      h("section", { "aria-labelledby": "queue-title" },
        h("h2", { id: "queue-title" }, "Queue ", this.queueCount),
        h("p", { class: "hint" }, "Queued runs, oldest first: the order workers take them in."), this.queue));
  }

  update() {
    return true;
  }

  async start() {
    await this.refresh();
  }

  async refresh() {
    clearTimeout(this.timer);
    if (this.disposed) return;
    try {
      const [workers, queued] = await Promise.all([api("/workers"),
        api("/runs", { query: { status: "queued", order: "oldest", limit: QUEUE_SHOWN } })]);
      if (this.disposed) return;
      this.render(workers.items, queued);
      replaceChildren(this.message);
      this.updated.textContent = `updated ${datetime(Date.now()).slice(11)}`;
    } catch (error) {
      if (this.disposed) return;
      replaceChildren(this.message, h("p", { class: "error-text" },
        error instanceof ApiError ? `Could not read the workers: ${error.message}` : String(error)));
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

  render(workers, queued) {
    const now = Date.now();
    replaceChildren(this.workers, table("Live workers", [{ label: "Worker" }, { label: "Host" }, { label: "PID", num: true },
      { label: "Started" }, { label: "Heartbeat" }, { label: "Runs held", num: true }, { label: "Running" }],
    workers.map((w) => h("tr", { dataset: { worker: w.workerId } },
      h("td", {}, h("code", {}, w.workerId)),
      h("td", {}, w.host),
      h("td", { class: "num" }, String(w.pid)),
      h("td", {}, h("time", { datetime: new Date(w.startedAt).toISOString() }, datetime(w.startedAt))),
      h("td", {}, h("time", { datetime: new Date(w.heartbeatAt).toISOString(), title: datetime(w.heartbeatAt) },
        ago(w.heartbeatAt, now))),
      h("td", { class: "num" }, `${w.runs.length} of ${w.concurrency}`),
      h("td", { class: "held" }, w.runs.length ? w.runs.map((r) => [runLink(r), " "]) : "—"))),
    "No live worker: queued runs wait until `flowkernel worker` (or `serve --workers N`) runs on this store."));
    this.queueCount.textContent = `(${queued.items.length}${queued.nextCursor ? "+" : ""})`;
    replaceChildren(this.queue, table("Queued runs, oldest first", [{ label: "#", num: true }, { label: "Run" },
      { label: "Flow" }, { label: "Queued" }, { label: "Waiting for" }],
    queued.items.map((run, i) => h("tr", { dataset: { run: run.runId } },
      h("td", { class: "num" }, String(i + 1)),
      h("td", {}, runLink(run.runId)),
      h("td", {}, run.flowName),
      h("td", {}, h("time", { datetime: new Date(run.createdAt).toISOString() }, datetime(run.createdAt))),
      h("td", {}, ago(run.createdAt, now).replace(/ ago$/, "")))),
    "Nothing is queued."));
  }

  dispose() {
    this.disposed = true;
    clearTimeout(this.timer);
  }
}
