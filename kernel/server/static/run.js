// A run's page: the flow as a graph coloured by the snapshot, the live timeline over the event
// stream, each agent's conversation, the snapshot after any event (?at=SEQ), errors, usage and
// cost, and the commands the run's state allows.
//
// Scheduling rules live in the server's reducer only: the page never folds events itself. It
// re-reads the run (GET /runs/{id}, or ?at=SEQ for a past snapshot) when events arrive.

import { Actions } from "./actions.js";
import { api, ApiError, followStream, post } from "./api.js";
import { Agents } from "./conversation.js";
import { h, replaceChildren, uid } from "./dom.js";
import { cost, datetime, duration, preview, usage, valueBlock } from "./format.js";
import { FlowGraph, forEachProgress } from "./graph.js";
import { runLink, statusBadge } from "./runs.js";
import { MODES, Timeline, rerunVerdict } from "./timeline.js";

const REFRESH_DEBOUNCE_MS = 150;
const ERROR_EVENTS = new Set(["node:error", "agent:error"]);

function section(title, ...body) {
  return h("section", { class: "panel-section" }, h("h3", {}, title), body);
}

export class RunPage {
  constructor(runId, params) {
    this.runId = runId;
    this.at = parseAt(params);
    this.mode = params.get("timeline") === "order" ? "order" : "node";
    this.live = null; // the run now: {run, snapshot, children}
    this.view = null; // what the graph shows: the run now, or after event `at`
    this.flow = null; // the flow the graph draws: the one the shown snapshot follows
    this.flows = new Map(); // flowHash -> flow document: a `flow:updated` switches a run to another flow
    this.graph = null;
    this.selected = null;
    this.lastSeq = 0;
    this.types = new Map(); // seq -> event type, for the slider's label
    this.errors = [];
    this.abort = new AbortController();
    this.refreshing = null;
    this.dirty = false;
    this.timer = null;
    this.element = h("div", { class: "run-page" }, h("p", { class: "loading" }, "Loading run…"));
  }

  async start() {
    try {
      const id = encodeURIComponent(this.runId);
      const [live, flow] = await Promise.all([api(`/runs/${id}`), api(`/runs/${id}/flow`)]);
      if (this.abort.signal.aborted) return;
      this.live = live;
      this.flow = flow;
      if (live.snapshot.flowHash) this.flows.set(live.snapshot.flowHash, flow);
      this.build();
      this.lastSeq = live.run.seq;
      this.renderLive();
      await this.setAt(this.at, { force: true });
      this.follow();
    } catch (error) {
      if (this.abort.signal.aborted) return;
      const notFound = error instanceof ApiError && error.status === 404;
      replaceChildren(this.element, h("div", { class: "page-message" },
        h("h1", {}, notFound ? "No such run" : "Could not load the run"),
        h("p", { class: "error-text" }, error.message),
        h("p", {}, h("a", { href: "#/" }, "All runs"))));
    }
  }

  build() {
    const flow = this.flow;
    this.title = h("h1", {}, flow.name, " ", h("code", { class: "run-id" }, this.runId));
    this.badge = h("span");
    this.streamState = h("span", { class: "stream-state", role: "status" });
    this.meta = h("dl", { class: "run-meta" });
    this.banner = h("div", { class: "run-error", role: "alert", hidden: true });
    this.verdict = h("div", { class: "rerun-note", hidden: true });
    this.graph = new FlowGraph(flow, { onSelect: (id) => this.selectNode(id) });

    const sliderId = uid("at");
    this.slider = h("input", { id: sliderId, type: "range", min: 1, max: 1, value: 1, step: 1,
      "aria-describedby": `${sliderId}-out` });
    this.sliderOut = h("output", { id: `${sliderId}-out`, for: sliderId });
    this.liveButton = h("button", { type: "button", onclick: () => this.navigateAt(null) }, "Back to live");
    this.forkButton = h("button", { type: "button", "aria-expanded": "false", onclick: () => this.toggleFork() },
      "Fork from here");
    this.rerunButton = h("button", { type: "button", onclick: () => this.rerun(),
      title: "Execute this run's flow again, its model calls and replies served from this run's recording" }, "Rerun");
    this.forkPanel = this.forkForm();
    this.slider.addEventListener("input", () => this.labelSlider(Number(this.slider.value)));
    this.slider.addEventListener("change", () => this.navigateAt(Number(this.slider.value), true));
    this.travelNote = h("p", { class: "travel-note", hidden: true });

    this.inspector = h("div", { class: "inspector", "aria-live": "polite" },
      h("p", { class: "empty" }, "Select a node to see its status, output and errors."));
    this.actions = new Actions({ runId: this.runId, flow, onCommand: () => this.refreshSoon(0) });
    this.timeline = new Timeline({ onPickSeq: (seq) => this.navigateAt(seq), mode: this.mode,
      runError: () => (this.live ? this.live.run.error : null) });
    this.modeButtons = Object.entries(MODES).map(([mode, label]) => h("button", { type: "button",
      "aria-pressed": String(mode === this.mode), dataset: { mode }, onclick: () => this.navigate({ timeline: mode }) },
    label));
    this.agents = new Agents(this.runId);
    this.snapshotPanel = h("div", { class: "snapshot-panel" });
    this.runPanel = h("div", { class: "run-panel" });
    this.errorCount = h("span", { class: "count", hidden: true });

    const timelineView = [h("div", { class: "timeline-head", role: "group", "aria-label": "order of the timeline" },
      h("span", { class: "label" }, "Events"), this.modeButtons), this.timeline.element];
    const tabs = [["timeline", "Timeline", timelineView], ["agents", "Agents", this.agents.element],
      ["snapshot", "Snapshot", this.snapshotPanel], ["details", ["Run", this.errorCount], this.runPanel]];
    this.tabButtons = new Map();
    this.tabPanels = new Map();
    const tablist = h("div", { class: "tabs", role: "tablist", "aria-label": "run views" });
    const panels = [];
    for (const [key, label, content] of tabs) {
      const tabId = uid("tab");
      const panelId = uid("panel");
      const button = h("button", { type: "button", role: "tab", id: tabId, "aria-controls": panelId,
        "aria-selected": "false", tabindex: -1, dataset: { tab: key }, onclick: () => this.showTab(key) }, label);
      button.addEventListener("keydown", (event) => this.tabKey(event, key));
      const panel = h("div", { role: "tabpanel", id: panelId, "aria-labelledby": tabId, class: `tab-panel panel-${key}`,
        hidden: true }, content);
      this.tabButtons.set(key, button);
      this.tabPanels.set(key, panel);
      tablist.append(button);
      panels.push(panel);
    }

    replaceChildren(this.element,
      h("header", { class: "run-head" },
        h("nav", { class: "crumbs", "aria-label": "breadcrumbs" }, h("a", { href: "#/" }, "Runs"), " / ",
          h("a", { href: `#/?flow=${encodeURIComponent(flow.name)}` }, flow.name)),
        h("div", { class: "title-line" }, this.title, this.badge, this.streamState),
        flow.description ? h("p", { class: "description" }, flow.description) : null,
        this.meta, this.verdict, this.banner),
      h("div", { class: "run-grid" },
        this.left = h("div", { class: "left" },
          h("section", { class: "graph-panel", "aria-labelledby": "graph-title" },
            h("div", { class: "panel-head" }, h("h2", { id: "graph-title" }, "Flow"), legend()),
            h("div", { class: "graph-scroll" }, this.graph.element),
            h("div", { class: "travel" },
              h("label", { for: sliderId }, "Snapshot after event"), this.slider, this.sliderOut,
              h("div", { class: "buttons travel-buttons" }, this.liveButton, this.forkButton, this.rerunButton)),
            this.forkPanel,
            this.travelNote,
            this.inspector),
          this.actions.element),
        h("div", { class: "right" }, tablist, panels)));
    this.showTab("timeline");
  }

  tabKey(event, key) {
    const keys = [...this.tabButtons.keys()];
    const i = keys.indexOf(key);
    const next = { ArrowRight: keys[(i + 1) % keys.length], ArrowLeft: keys[(i + keys.length - 1) % keys.length],
      Home: keys[0], End: keys[keys.length - 1] }[event.key];
    if (!next) return;
    event.preventDefault();
    this.showTab(next);
    this.tabButtons.get(next).focus();
  }

  showTab(key) {
    for (const [k, button] of this.tabButtons) {
      const on = k === key;
      button.setAttribute("aria-selected", String(on));
      button.tabIndex = on ? 0 : -1;
      this.tabPanels.get(k).hidden = !on;
    }
  }

  // -- the stream ------------------------------------------------------------------------------

  /** Follow the stream after event `after`. The stream ends with flow:complete, but a failed run can
   * go on (retry or resume, from this page or anywhere else): then the page keeps listening after
   * the end, and says "live" again only when something arrives. */
  follow(after = 0) {
    let ended = null;
    let quiet = after > 0;
    followStream(this.runId, {
      after,
      signal: this.abort.signal,
      onEvent: (event) => {
        if (quiet) {
          quiet = false;
          this.showStreamState("open");
        }
        if (event.type === "flow:complete") ended = event;
        this.onEvent(event);
      },
      onState: (state, error) => {
        if (!(quiet && state === "open")) this.showStreamState(state, error);
      },
    }).then(() => {
      if (ended && ended.status === "failed" && !this.abort.signal.aborted) this.follow(ended.seq);
    });
  }

  showStreamState(state, error = null) {
    const text = { open: "● live", reconnecting: "reconnecting…", closed: "finished", error: "stream refused" }[state];
    this.streamState.textContent = text;
    this.streamState.className = `stream-state stream-${state}`;
    if (state === "error" && error) this.streamState.title = error.message;
  }

  onEvent(event) {
    this.types.set(event.seq, event.type);
    this.timeline.add(event);
    this.agents.add(event);
    if (event.type === "flow:complete" && event.rerun) {
      replaceChildren(this.verdict, rerunVerdict(event.rerun));
      this.verdict.hidden = false;
    }
    if (ERROR_EVENTS.has(event.type) || (event.type === "flow:complete" && event.error)) {
      this.errors.push(event);
      this.renderErrors();
      if (this.live && this.live.run.error) this.renderBanner(this.live.run);
    }
    if (event.seq > this.lastSeq) {
      this.lastSeq = event.seq;
      // A streamed delta changes no snapshot: re-read the run for every other event.
      if (!event.type.endsWith(":delta")) this.refreshSoon();
    }
    this.updateSlider();
    if (this.at !== null) this.timeline.markAt(this.at);
  }

  refreshSoon(delay = REFRESH_DEBOUNCE_MS) {
    if (this.refreshing) {
      this.dirty = true;
      return;
    }
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.refresh(), delay);
  }

  async refresh() {
    this.refreshing = api(`/runs/${encodeURIComponent(this.runId)}`, { signal: this.abort.signal });
    try {
      const live = await this.refreshing;
      const flow = await this.flowOf(live);
      this.live = live;
      this.lastSeq = Math.max(this.lastSeq, this.live.run.seq);
      this.actions.useFlow(flow);
      this.renderLive();
      if (this.at === null) this.renderView(this.live, flow);
    } catch (error) {
      if (this.abort.signal.aborted) return;
      this.streamState.textContent = `could not refresh: ${error.message}`;
    } finally {
      this.refreshing = null;
    }
    if (this.dirty) {
      this.dirty = false;
      this.refreshSoon();
    }
  }

  // -- time travel ------------------------------------------------------------------------------

  navigateAt(seq, replace = false) {
    this.navigate({ at: seq === null ? null : String(seq) }, replace);
  }

  /** Change the address's parameters (``at``, ``timeline``): the page follows it (``update``). */
  navigate(changes, replace = false) {
    const q = new URLSearchParams();
    const values = { at: this.at === null ? null : String(this.at), timeline: this.mode === "node" ? null : this.mode,
      ...changes };
    if (values.timeline === "node") values.timeline = null;
    for (const [key, value] of Object.entries(values)) if (value !== null && value !== undefined) q.set(key, value);
    const text = q.toString();
    const hash = `#/runs/${encodeURIComponent(this.runId)}${text ? `?${text}` : ""}`;
    if (replace) location.replace(hash);
    else location.hash = hash;
  }

  update(params) {
    const mode = params.get("timeline") === "order" ? "order" : "node";
    if (mode !== this.mode && this.timeline) {
      this.mode = mode;
      this.timeline.setMode(mode);
      for (const b of this.modeButtons) b.setAttribute("aria-pressed", String(b.dataset.mode === mode));
    }
    this.setAt(parseAt(params));
    return true;
  }

  // -- fork and rerun ---------------------------------------------------------------------------

  /** The event a fork starts after: the one the slider shows. */
  forkSeq() {
    return this.at === null ? this.lastSeq : this.at;
  }

  forkForm() {
    const id = uid("fork-input");
    this.forkInput = h("textarea", { id, name: "input", rows: 3, class: "json", spellcheck: "false",
      placeholder: '{"key": "a new value"}' });
    this.forkTitle = h("h3", {}, "Fork");
    this.forkError = h("p", { class: "field-error", hidden: true, role: "alert" });
    const submit = h("button", { type: "submit", class: "primary" }, "Start the fork");
    const form = h("form", { class: "fork-form card", hidden: true, novalidate: true, "aria-label": "fork the run" },
      this.forkTitle,
      h("p", { class: "hint" }, "A new run with this run's history up to the event, going on from there. Change input " +
        "values from here on (nodes that have finished keep their outputs), or leave it empty."),
      h("div", { class: "field" }, h("label", { for: id }, "Input changes (JSON object, optional)"), this.forkInput),
      this.forkError, h("div", { class: "buttons" }, submit));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = { at: this.forkSeq() };
      const text = this.forkInput.value.trim();
      this.forkError.hidden = true;
      if (text) {
        let value;
        try { value = JSON.parse(text); } catch { value = undefined; }
        if (!value || typeof value !== "object" || Array.isArray(value)) {
          this.forkError.textContent = "Input changes must be a JSON object, such as {\"name\": \"Ada\"}";
          this.forkError.hidden = false;
          this.forkInput.setAttribute("aria-invalid", "true");
          this.forkInput.focus();
          return;
        }
        body.input = value;
      }
      this.forkInput.removeAttribute("aria-invalid");
      await this.startRun(`/runs/${encodeURIComponent(this.runId)}/fork`, body, [submit], this.forkError);
    });
    return form;
  }

  toggleFork() {
    const open = this.forkPanel.hidden;
    this.forkPanel.hidden = !open;
    this.forkButton.setAttribute("aria-expanded", String(open));
    this.labelFork();
    if (open) this.forkInput.focus();
  }

  labelFork() {
    if (!this.forkTitle) return;
    const seq = this.forkSeq();
    this.forkTitle.textContent = `Fork from the snapshot after event #${seq}${this.types.has(seq) ? ` (${this.types.get(seq)})` : ""}`;
  }

  async rerun() {
    await this.startRun(`/runs/${encodeURIComponent(this.runId)}/rerun`, {}, [this.rerunButton], null);
  }

  /** POST a new run (fork, rerun) and open it; a refusal is shown where ``where`` says (or the actions'). */
  async startRun(path, body, controls, where) {
    controls.forEach((c) => { c.disabled = true; });
    try {
      const run = await post(path, body);
      location.hash = `#/runs/${encodeURIComponent(run.runId)}`;
    } catch (error) {
      if (where) {
        where.textContent = `Refused: ${error.message}`;
        where.hidden = false;
      } else {
        this.actions.showRefusal(path.endsWith("/rerun") ? "rerun" : "fork", error);
      }
    } finally {
      controls.forEach((c) => { c.disabled = false; });
    }
  }

  async setAt(at, { force = false } = {}) {
    if (!this.graph) return;
    if (at === this.at && !force) return;
    this.at = at;
    this.timeline.markAt(at);
    this.updateSlider();
    if (at === null) {
      this.travelNote.hidden = true;
      this.renderView(this.live, await this.flowOf(this.live));
      return;
    }
    try {
      const view = await api(`/runs/${encodeURIComponent(this.runId)}`, { query: { at }, signal: this.abort.signal });
      const flow = await this.flowOf(view);
      if (this.at !== at) return;
      this.renderView(view, flow);
      this.travelNote.hidden = false;
      replaceChildren(this.travelNote, `Time travel: the graph, node details and snapshot show the run right after ` +
        `event #${at}${this.types.has(at) ? ` (${this.types.get(at)})` : ""}. Actions act on the run as it is now.`);
    } catch (error) {
      if (this.abort.signal.aborted) return;
      this.travelNote.hidden = false;
      replaceChildren(this.travelNote, h("span", { class: "error-text" }, `No snapshot after event ${at}: ${error.message}`));
    }
  }

  updateSlider() {
    if (!this.slider) return;
    this.slider.max = String(Math.max(1, this.lastSeq));
    const value = this.at === null ? this.lastSeq : this.at;
    if (document.activeElement !== this.slider || this.at === null) this.slider.value = String(value);
    this.labelSlider(value);
    this.liveButton.disabled = this.at === null;
    this.forkButton.disabled = this.lastSeq < 1;
    this.rerunButton.disabled = this.lastSeq < 1;
    this.labelFork();
  }

  labelSlider(value) {
    const type = this.types.get(value);
    this.sliderOut.textContent = `#${value} of ${this.lastSeq}${type ? ` · ${type}` : ""}${this.at === null ? " (live)" : ""}`;
  }

  // -- rendering ----------------------------------------------------------------------------

  renderLive() {
    const { run } = this.live;
    replaceChildren(this.badge, statusBadge(run.status));
    const item = (label, ...value) => h("div", {}, h("dt", {}, label), h("dd", {}, value));
    const took = run.durationMs !== null ? duration(run.durationMs) : `${duration(Date.now() - run.createdAt)} so far`;
    replaceChildren(this.meta,
      item("created", h("time", { datetime: new Date(run.createdAt).toISOString() }, datetime(run.createdAt))),
      item("duration", took),
      item("cost", h("strong", { class: "total-cost" }, cost(run.totalCostUsd))),
      item("tokens", usage(run.usage)),
      item("events", String(run.seq)),
      run.parentRunId ? item("parent", runLink(run.parentRunId)) : null,
      run.forkedFrom ? item("fork of", h("a", { href: `#/runs/${encodeURIComponent(run.forkedFrom)}?at=${run.forkedAt}` },
        `${run.forkedFrom} at #${run.forkedAt}`)) : null,
      run.rerunOf ? item("rerun of", runLink(run.rerunOf)) : null,
      this.live.children.length ? item("children", String(this.live.children.length)) : null);
    this.banner.hidden = !run.error;
    if (run.error) this.renderBanner(run);
    this.timeline.runErrorChanged();
    if (this.actions.update(this.live)) {
      // A question for the reader comes first; otherwise the graph does.
      if (this.actions.asksForReply) this.left.prepend(this.actions.element);
      else this.left.append(this.actions.element);
    }
    this.renderRunPanel();
  }

  /** The run's error, the one place the page shows it whole: several lines keep their breaks (a fixture
   * diff's recorded and live lines align), with the details of the node error it comes from. */
  renderBanner(run) {
    const source = [...this.errors].reverse().find((e) => e.type !== "flow:complete" && e.message
      && run.error.includes(e.message) && e.details !== undefined && e.details !== null);
    const text = run.error.includes("\n") ? h("pre", { class: "error-message" }, run.error) : run.error;
    replaceChildren(this.banner, h("strong", {}, `Run ${run.status}: `), text,
      source ? h("details", { class: "value-details" }, h("summary", {}, `details (event #${source.seq})`),
        valueBlock(source.details)) : null);
  }

  /** The flow ``view``'s snapshot follows (fetched once per flow: most runs only ever have one). */
  async flowOf(view) {
    const hash = view.snapshot.flowHash;
    if (!hash) return this.flow;
    if (!this.flows.has(hash)) {
      const seq = view.snapshot.seq;
      const flow = await api(`/runs/${encodeURIComponent(this.runId)}/flow`,
        { query: seq ? { at: seq } : {}, signal: this.abort.signal });
      this.flows.set(hash, flow);
    }
    return this.flows.get(hash);
  }

  renderView(view, flow = this.flow) {
    if (flow !== this.flow) {
      // Another flow (the run was continued on an updated one, or the view is from before that):
      // its graph is drawn in place of the other's.
      this.flow = flow;
      const previous = this.graph.element;
      this.graph = new FlowGraph(flow, { onSelect: (id) => this.selectNode(id) });
      previous.replaceWith(this.graph.element);
      if (this.selected) this.graph.select(this.selected);
    }
    this.view = view;
    this.graph.paint(view.snapshot);
    this.renderInspector();
    this.renderSnapshot();
  }

  selectNode(nodeId) {
    this.selected = nodeId;
    this.graph.select(nodeId);
    this.renderInspector();
  }

  renderInspector() {
    if (!this.selected || !this.view) return;
    const id = this.selected;
    const snap = this.view.snapshot;
    const node = (this.flow.nodes || []).find((n) => n.id === id);
    const status = (snap.nodeStatus || {})[id] || "pending";
    const fault = (snap.faults || {})[id];
    const waiting = (snap.waiting || {})[id];
    const progress = forEachProgress(snap, id, this.flow);
    const loops = (this.flow.edges || []).filter((e) => e.maxIterations !== undefined && (e.from === id || e.to === id));
    const rows = [
      ["type", node.type],
      ["status", statusBadge(status)],
      ["node run", (snap.nodeRuns || {})[id] ? h("code", {}, snap.nodeRuns[id]) : "—"],
      ["attempt", String((snap.attempts || {})[id] || "—")],
      progress ? ["forEach", `${progress.done} of ${progress.total} done`] : null,
      ...loops.map((e) => {
        const eid = e.id ?? `${e.from}->${e.to}`;
        return ["loop", `${eid}: ${(snap.loopCounters || {})[eid] || 0} of ${e.maxIterations}`];
      }),
      (snap.agentSessions || {})[id] ? ["session", h("code", {}, snap.agentSessions[id])] : null,
    ].filter(Boolean);
    const buttons = h("div", { class: "buttons" },
      h("button", { type: "button", onclick: () => { this.showTab("timeline"); this.timeline.showNode(id); } },
        "Show in timeline"),
      node.type === "claude.agent" ? h("button", { type: "button", onclick: () => { this.showTab("agents"); this.agents.open(id); } },
        "Conversation") : null);
    replaceChildren(this.inspector,
      h("h3", {}, id),
      h("dl", { class: "facts" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      fault ? h("div", { class: "fault" }, h("strong", {}, `${fault.errorType}: `), fault.message) : null,
      waiting ? h("div", { class: "waiting-note" }, h("strong", {}, "Waiting: "),
        typeof waiting.prompt === "string" ? waiting.prompt : preview(waiting.prompt, 300)) : null,
      id in (snap.outputs || {}) ? h("details", { class: "value-details", open: true }, h("summary", {}, "output"),
        valueBlock(snap.outputs[id])) : null,
      buttons);
  }

  renderSnapshot() {
    const snap = this.view.snapshot;
    const title = this.at === null ? `Snapshot now (after event #${snap.seq})` : `Snapshot after event #${snap.seq}`;
    const keys = ["status", "nodeStatus", "edgeStatus", "loopCounters", "outputs", "state", "waiting", "inbox",
      "faults", "forEach", "attempts", "nodeRuns", "agentSessions", "usage", "totalCostUsd", "error"];
    // Keep what the reader opened or closed across refreshes; at first, open the usual suspects.
    const shown = [...this.snapshotPanel.querySelectorAll("details[data-key]")];
    const open = shown.length ? new Set(shown.filter((d) => d.open).map((d) => d.dataset.key))
      : new Set(["nodeStatus", "outputs", "state"]);
    replaceChildren(this.snapshotPanel, h("h3", {}, title),
      keys.filter((k) => snap[k] !== undefined).map((k) => {
        const d = h("details", { class: "value-details", dataset: { key: k } }, h("summary", {}, k), valueBlock(snap[k]));
        d.open = open.has(k);
        return d;
      }),
      h("details", { class: "value-details" }, h("summary", {}, "the whole snapshot (JSON)"), valueBlock(snap)));
  }

  renderRunPanel() {
    const { run, children } = this.live;
    replaceChildren(this.runPanel,
      section("Input", valueBlock(run.input)),
      section("Usage and cost", h("dl", { class: "facts" },
        h("dt", {}, "total cost"), h("dd", {}, cost(run.totalCostUsd)),
        h("dt", {}, "input tokens"), h("dd", {}, String(run.usage.inputTokens)),
        h("dt", {}, "output tokens"), h("dd", {}, String(run.usage.outputTokens)),
        h("dt", {}, "cache reads"), h("dd", {}, String(run.usage.cacheReadInputTokens)),
        h("dt", {}, "cache writes"), h("dd", {}, String(run.usage.cacheCreationInputTokens))),
      h("p", { class: "hint" }, "Child runs included.")),
      section(`Child runs (${children.length})`, children.length ? h("table", { class: "children" },
        h("thead", {}, h("tr", {}, ["Status", "Run", "Flow", "Duration", "Cost"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, children.map((c) => h("tr", {}, h("td", {}, statusBadge(c.status)), h("td", {}, runLink(c.runId)),
          h("td", {}, c.flowName), h("td", {}, duration(c.durationMs)), h("td", {}, cost(c.totalCostUsd))))))
        : h("p", { class: "empty" }, "None.")),
      this.errorsSection = section("Errors", h("div", { class: "errors-body" })));
    this.renderErrors();
  }

  renderErrors() {
    if (!this.errorsSection || !this.live) return;
    const body = this.errorsSection.querySelector(".errors-body");
    // A node's fault is the message of its last node:error: listed once, by the event when it is here.
    const reported = new Set(this.errors.filter((e) => e.type === "node:error").map((e) => e.nodeId));
    const faults = Object.entries(this.live.snapshot.faults || {}).filter(([node]) => !reported.has(node));
    const items = [
      ...faults.map(([node, f]) => h("li", { class: "fault" }, h("strong", {}, node), ` ${f.errorType}: ${f.message}`)),
      ...this.errors.map((e) => h("li", {},
        h("button", { type: "button", class: "seq", onclick: () => this.navigateAt(e.seq) }, `#${e.seq}`), " ",
        h("span", { class: "ev-type" }, e.type), " ", e.nodeId ? h("strong", {}, e.nodeId) : null, " ",
        e.type === "flow:complete" ? (e.error === this.live.run.error ? `run ${e.status} (the error above)` : e.error)
          : `${e.errorType}: ${e.message}`,
        e.details !== undefined && e.details !== null ? valueBlock(e.details) : null)),
    ];
    replaceChildren(body, items.length ? h("ul", { class: "errors" }, items) : h("p", { class: "empty" }, "None."));
    this.errorCount.hidden = !items.length;
    this.errorCount.textContent = ` ${items.length}`;
    this.errorCount.setAttribute("aria-label", `${items.length} errors`);
  }

  dispose() {
    this.abort.abort();
    clearTimeout(this.timer);
  }
}

function parseAt(params) {
  const raw = params.get("at");
  if (raw === null || !/^\d+$/.test(raw)) return null;
  return Number(raw);
}

function legend() {
  return h("ul", { class: "legend", "aria-label": "colours" },
    ["pending", "running", "waiting", "done", "failed", "skipped"].map((s) =>
      h("li", {}, h("span", { class: `swatch st-${s}`, "aria-hidden": "true" }), s)));
}
