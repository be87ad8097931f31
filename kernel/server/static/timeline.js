// The live timeline of a run's events, read two ways: by node run (run-level events in order, and
// everything a node run does, its agent's text and thinking as they stream, its tool calls, errors and
// waits, nested under it) or in order (every event in strict seq order, as the log has them).

import { h, replaceChildren } from "./dom.js";
import { duration, clock, cost, preview, usage, valueBlock } from "./format.js";
import { markdown } from "./markdown.js";

const NODE_RUN_EVENTS = /^(node:(start|complete|error|waiting)|agent:|inbox:consumed)/;
const MINOR = new Set(["edge:fire", "edge:skip", "state:patch", "agent:usage", "inbox:consumed"]);

function seqButton(seq, onPick) {
  return h("button", { type: "button", class: "seq", title: `Show the snapshot after event ${seq}`,
    "aria-label": `event ${seq}: show the snapshot after it`, onclick: () => onPick(seq) }, `#${seq}`);
}

function disclosure(label, value, open = false) {
  const d = h("details", { class: "value-details" }, h("summary", {}, label), valueBlock(value));
  d.open = open;
  return d;
}

function textOf(prompt) {
  return typeof prompt === "string" ? prompt : JSON.stringify(prompt);
}

export const MODES = { node: "by node run", order: "in order" };

export class Timeline {
  /** ``runError()``: the run's error now (the banner above shows it; rows that carry it say so
   * instead of repeating it). */
  constructor({ onPickSeq, runError = () => null, mode = "node" }) {
    this.onPickSeq = onPickSeq;
    this.runError = runError;
    this.mode = MODES[mode] ? mode : "node";
    this.list = h("ol", { class: "timeline", "aria-label": "events" });
    this.element = h("div", { class: "timeline-scroll", tabindex: 0, "aria-label": "timeline of events" }, this.list);
    this.events = []; // every event added, to draw the list again in the other mode
    this.at = null;
    this.reset();
    this.follow = true;
    this.scrollPending = false;
    this.element.addEventListener("scroll", () => {
      const el = this.element;
      this.follow = this.at === null && el.scrollTop + el.clientHeight >= el.scrollHeight - 32;
    });
  }

  reset() {
    this.groups = new Map(); // node run id -> group
    this.rows = []; // [{el, seq}] for marking the snapshot position
    this.slots = []; // error messages, shown unless the run's error shows them
    this.t0 = null;
    this.lastSeq = 0;
    replaceChildren(this.list);
    this.list.dataset.mode = this.mode;
  }

  /** Draw every event again, ``mode`` "node" (grouped by node run) or "order" (strict seq order). */
  setMode(mode) {
    if (!MODES[mode] || mode === this.mode) return;
    this.mode = mode;
    const events = this.events;
    this.events = [];
    this.reset();
    for (const event of events) this.add(event);
    this.markAt(this.at);
  }

  row(event, kind, text, extra = [], node = null) {
    const li = h("li", { class: `ev ev-${kind}${MINOR.has(event.type) ? " minor" : ""}`, dataset: { seq: event.seq } },
      h("div", { class: "ev-line" },
        seqButton(event.seq, this.onPickSeq),
        h("span", { class: "ev-time", title: clock(event.timestamp) }, this.relative(event.timestamp)),
        h("span", { class: "ev-type" }, event.type),
        node ? h("strong", { class: "ev-node" }, node) : null,
        h("span", { class: "ev-text" }, text)),
      extra);
    this.rows.push({ el: li, seq: event.seq });
    return li;
  }

  /** An error message, kept up to date with the run's error: a message the run's error already shows
   * (the banner above) says so instead of repeating it; several lines (a fixture diff's recorded and
   * live lines) keep their breaks and alignment. ``details`` go with the message, where it is shown. */
  errorText(message, details = null) {
    const slot = h("span", { class: "error-slot" });
    const more = details !== undefined && details !== null ? disclosure("details", details) : null;
    const entry = { slot, more, message };
    this.slots.push(entry);
    this.fill(entry);
    return more ? [slot, more] : [slot];
  }

  fill({ slot, more, message }) {
    const error = this.runError();
    const shownAbove = Boolean(message && error && error.includes(message));
    if (slot.dataset.above === String(shownAbove) && slot.childNodes.length) return;
    slot.dataset.above = String(shownAbove);
    replaceChildren(slot, shownAbove ? h("span", { class: "see-above" }, "the run's error, shown above")
      : typeof message === "string" && message.includes("\n") ? h("pre", { class: "error-message" }, message) : message);
    if (more) more.hidden = shownAbove;
  }

  /** The run's error changed (it failed, or was retried): rows that carry it say so again. */
  runErrorChanged() {
    for (const entry of this.slots) this.fill(entry);
  }

  relative(timestamp) {
    if (this.t0 === null) this.t0 = timestamp;
    return `+${duration(timestamp - this.t0)}`;
  }

  /** Add one event (in seq order, as the stream delivers them). */
  add(event) {
    if (event.seq <= this.lastSeq) return; // a reconnect never repeats, but be safe
    this.lastSeq = event.seq;
    this.events.push(event);
    const nodeRun = event.runId && NODE_RUN_EVENTS.test(event.type) ? event.runId
      : event.type === "command:received" && event.target && this.groups.has(event.target) ? event.target : null;
    if (nodeRun) {
      this.addToGroup(this.group(event, nodeRun), event);
    } else {
      const li = this.runRow(event);
      if (li) this.list.append(li);
    }
    this.scrollSoon();
  }

  scrollSoon() {
    if (!this.follow || this.scrollPending) return;
    this.scrollPending = true;
    requestAnimationFrame(() => {
      this.scrollPending = false;
      this.element.scrollTop = this.element.scrollHeight;
    });
  }

  group(event, nodeRun) {
    let g = this.groups.get(nodeRun);
    if (g) return g;
    if (this.mode === "order") {
      // In order: the node run's events are rows of the list itself, each naming its node.
      const label = `${event.nodeId || "?"}${event.item !== undefined && event.item !== null ? `[${event.item}]` : ""}`;
      g = { flat: true, label, body: this.list, status: h("span"), took: h("span"), li: h("li"), nodeId: event.nodeId,
        text: null, thinking: null, state: "running" };
      this.groups.set(nodeRun, g);
      return g;
    }
    const status = h("span", { class: "badge st-running" }, "running");
    const took = h("span", { class: "took" });
    const summary = h("summary", {},
      h("strong", { class: "noderun-node" }, event.nodeId || "?"),
      event.item !== undefined && event.item !== null ? h("span", { class: "item" }, `item ${event.item}`) : null,
      event.attempt > 1 ? h("span", { class: "attempt" }, `attempt ${event.attempt}`) : null,
      status, took, h("code", { class: "noderun-id" }, nodeRun));
    const body = h("ol", { class: "noderun-body" });
    const details = h("details", { open: true }, summary, body);
    const li = h("li", { class: "noderun", dataset: { node: event.nodeId || "", run: nodeRun, seq: event.seq } }, details);
    g = { li, body, status, took, nodeId: event.nodeId, text: null, thinking: null, state: "running" };
    this.groups.set(nodeRun, g);
    this.rows.push({ el: li, seq: event.seq });
    this.list.append(li);
    return g;
  }

  setStatus(g, state, label = state) {
    g.state = state;
    g.status.className = `badge st-${state}`;
    g.status.textContent = label;
    g.li.dataset.status = state;
  }

  addToGroup(g, e) {
    const add = (li) => g.body.append(li);
    const row = (event, kind, text, extra = []) => this.row(event, kind, text, extra, g.flat ? g.label : null);
    // A streamed block ends where the node run does something else (a complete block may follow or not).
    if (g.text && e.type !== "agent:text:delta" && e.type !== "agent:text") this.endBlock(g, "text");
    if (g.thinking && e.type !== "agent:thinking:delta" && e.type !== "agent:thinking") this.endBlock(g, "thinking");
    switch (e.type) {
      case "node:start":
        this.setStatus(g, "running");
        add(row(e, "start", `started${e.attempt ? `, attempt ${e.attempt}` : ""}` +
          `${e.resumedFrom ? ` (resumes ${e.resumedFrom})` : ""}`, [disclosure("input", e.input)]));
        break;
      case "node:complete":
        this.setStatus(g, "done");
        if (e.durationMs >= 0) g.took.textContent = duration(e.durationMs);
        add(row(e, "complete", `done in ${duration(e.durationMs ?? 0)}`, [disclosure("output", e.output)]));
        break;
      case "node:error":
        this.setStatus(g, "failed", e.willRetry ? "failed, will retry" : "failed");
        if (e.willRetry) {
          add(row(e, "error", `${e.errorType}: ${e.message} (will retry)`,
            e.details !== undefined && e.details !== null ? [disclosure("details", e.details)] : []));
        } else {
          const [slot, more] = this.errorText(e.message, e.details);
          add(row(e, "error", [`${e.errorType}: `, slot], more ? [more] : []));
        }
        break;
      case "node:waiting":
        this.setStatus(g, "waiting");
        if (e.prompt && typeof e.prompt === "object" && e.prompt.childRunId) {
          add(row(e, "waiting", ["waiting on its child run ", h("a", {
            href: `#/runs/${encodeURIComponent(e.prompt.childRunId)}` }, e.prompt.childRunId)]));
        } else {
          add(row(e, "waiting", "waiting for a reply", [h("pre", { class: "value prompt" }, textOf(e.prompt))]));
        }
        break;
      case "agent:start":
        add(row(e, "agent", `agent on ${e.model}`, [disclosure("prompt", e.prompt)]));
        break;
      case "agent:text:delta":
      case "agent:thinking:delta": {
        const key = e.type === "agent:text:delta" ? "text" : "thinking";
        if (!g[key]) g[key] = this.streamBlock(g, e, key);
        g[key].pre.append(e.content);
        break;
      }
      case "agent:text":
      case "agent:thinking": {
        const key = e.type === "agent:text" ? "text" : "thinking";
        const block = g[key] || this.streamBlock(g, e, key);
        if (key === "text") {
          // The whole block: Markdown, rendered and sanitised, in place of the streamed text.
          const rendered = markdown(e.content, { className: "agent-text" });
          block.pre.replaceWith(rendered);
          block.pre = rendered;
        } else {
          block.pre.textContent = e.content;
        }
        g[key] = block;
        this.endBlock(g, key);
        break;
      }
      case "agent:tool": {
        const body = [h("div", { class: "tool-part" }, h("h4", {}, "input"), valueBlock(e.toolInput)),
          h("div", { class: "tool-part" }, h("h4", {}, "output"), valueBlock(e.toolOutput))];
        if (e.error) body.unshift(h("p", { class: "error-text" }, e.error));
        const tool = h("details", { class: `tool${e.error ? " failed" : ""}` },
          h("summary", {}, h("span", { class: "tool-name" }, e.toolName), ` · ${duration(e.durationMs ?? 0)}`,
            e.error ? h("span", { class: "badge st-failed" }, "error") : null,
            h("span", { class: "tool-preview" }, ` ${preview(e.toolInput, 60)}`)), body);
        add(row(e, "tool", e.error ? "tool call failed" : "tool call", [tool]));
        break;
      }
      case "agent:error":
        {
          const [slot, more] = this.errorText(e.message, e.details);
          add(row(e, "error", [`${e.errorType}: `, slot], more ? [more] : []));
        }
        break;
      case "agent:compaction":
        add(row(e, "compaction", `context compacted: ${e.tokensBefore ?? 0} tokens summarized, the answer made ` +
          `from ${e.tokensAfter ?? 0}; ${e.messagesKept ?? 0} stored message${e.messagesKept === 1 ? "" : "s"} ` +
          `sent from now on, ${e.messagesSummarized ?? 0} no longer sent`));
        break;
      case "agent:usage":
        add(row(e, "usage", `${e.model} · ${usage(e.usage)} · ${cost(e.costUsd ?? 0)}`));
        break;
      case "agent:complete":
        add(row(e, "agent-done", `agent finished: ${e.numTurns ?? 0} turn${e.numTurns === 1 ? "" : "s"} · ` +
          `${cost(e.totalCostUsd ?? 0)} · ${duration(e.durationMs ?? 0)}`,
        e.structuredOutput !== undefined && e.structuredOutput !== null
          ? [disclosure("structured output", e.structuredOutput)] : []));
        break;
      case "inbox:consumed":
        add(row(e, "inbox", `took ${e.count} inbox message${e.count === 1 ? "" : "s"}`));
        break;
      case "command:received":
        add(this.commandRow(e, g.flat ? g.label : null));
        break;
      default:
        add(row(e, "other", preview(e, 100)));
    }
  }

  endBlock(g, key) {
    g[key].li.classList.remove("streaming");
    g[key] = null;
  }

  streamBlock(g, e, key) {
    const pre = h("pre", { class: `agent-${key}` });
    const li = this.row({ ...e, type: `agent:${key}` }, key, key === "text" ? "agent text" : "thinking", [pre],
      g.flat ? g.label : null);
    li.classList.add("streaming");
    g.body.append(li);
    return { li, pre };
  }

  commandRow(e, node = null) {
    const verdict = e.accepted ? "accepted" : "refused";
    const text = `${e.command} ${verdict}${e.reason ? `: ${e.reason}` : ""}`;
    const content = e.content !== undefined && e.content !== null ? e.content : e.contentPreview;
    const li = this.row(e, e.accepted ? "command" : "refused", text,
      content !== undefined && content !== null ? [h("pre", { class: "value" }, textOf(content))] : [], node);
    return li;
  }

  runRow(e) {
    switch (e.type) {
      case "flow:start":
        return this.row(e, "flow", `run of ${e.flowName} started` +
          `${e.parentRunId ? ` as a child of ${e.parentRunId}` : ""}`, [disclosure("input", e.input)]);
      case "flow:paused":
        this.interruptRunning();
        return this.row(e, "flow", `paused${e.reason ? `: ${e.reason}` : ""}`);
      case "flow:resumed":
        return this.row(e, "flow", `${e.retry ? "retried" : "resumed"}${e.message ? `: ${e.message}` : ""}`);
      case "flow:waiting":
        return this.row(e, "flow", `waiting${e.reason ? `: ${e.reason}` : ""}`);
      case "flow:complete": {
        this.interruptRunning();
        // The run's error is the banner's: this row says how the run ended, and a rerun's verdict.
        const error = e.error ? [": ", this.errorText(e.error)[0]] : [];
        const li = this.row(e, e.status === "completed" ? "flow" : "error", [`run ${e.status}`, ...error]);
        if (e.rerun) li.append(rerunVerdict(e.rerun));
        return li;
      }
      case "edge:fire":
      case "edge:skip":
        return this.row(e, "edge", `${e.from} → ${e.to} ${e.type === "edge:fire" ? "fired" : "skipped"}` +
          `${e.items ? ` for ${e.items.length} items` : ""}`);
      case "loop:iterate":
        return this.row(e, "loop", `loop ${e.edgeId}: iteration ${e.iteration}`);
      case "loop:exhausted":
        return this.row(e, "loop", `loop ${e.edgeId} exhausted after ${e.iteration} iterations`);
      case "node:skipped":
        return this.row(e, "skipped", `${e.nodeId} skipped (${e.reason})`);
      case "state:patch":
        return this.row(e, "state", `state ${e.op} ${e.path} = ${preview(e.value, 80)}`);
      case "command:received":
        return this.commandRow(e);
      default:
        return this.row(e, "other", preview(e, 100));
    }
  }

  interruptRunning() {
    for (const g of this.groups.values()) {
      if (g.state === "running") this.setStatus(g, "interrupted");
    }
  }

  /** Dim what happened after seq (null: nothing), mark the row of seq and scroll it into view (the
   * timeline stops following the end meanwhile). */
  markAt(seq) {
    const moved = seq !== this.at;
    this.at = seq;
    if (seq !== null) this.follow = false;
    else if (moved) this.follow = true; // back to live: follow the end again
    let current = null;
    for (const { el, seq: s } of this.rows) {
      el.classList.toggle("future", seq !== null && s > seq);
      const here = seq !== null && s === seq && el.classList.contains("ev");
      el.classList.toggle("current", here);
      if (here) current = el;
    }
    if (current && (moved || !this.shown)) {
      this.shown = true;
      const group = current.closest("li.noderun");
      if (group) group.querySelector("details").open = true;
      current.scrollIntoView({ block: "center" });
    }
    if (moved) this.shown = Boolean(current);
  }

  /** Scroll to the latest node run of nodeId and open it. */
  showNode(nodeId) {
    if (this.mode === "order") {
      // In order, a node run is its rows: show the last row of the node.
      const rows = [...this.list.querySelectorAll(":scope > li.ev")].filter((li) => li.querySelector(".ev-node")
        && [...this.groups.values()].some((g) => g.nodeId === nodeId && li.querySelector(".ev-node").textContent === g.label));
      const row = rows[rows.length - 1];
      if (!row) return false;
      row.scrollIntoView({ block: "nearest" });
      return true;
    }
    const groups = [...this.groups.values()].filter((g) => g.nodeId === nodeId);
    const last = groups[groups.length - 1];
    if (!last) return false;
    last.li.querySelector("details").open = true;
    last.li.scrollIntoView({ block: "nearest" });
    last.li.classList.remove("flash");
    void last.li.offsetWidth; // restart the animation
    last.li.classList.add("flash");
    return true;
  }
}

/** A rerun's verdict on its recording (its flow:complete's ``rerun``). */
export function rerunVerdict(rerun) {
  const link = (seq) => h("a", { href: `#/runs/${encodeURIComponent(rerun.of)}${seq ? `?at=${seq}` : ""}` },
    seq ? `event #${seq} of ${rerun.of}` : rerun.of);
  if (rerun.matches) {
    return h("p", { class: "rerun-verdict matches" }, "Matches the recording of ", link(null), ".");
  }
  const d = rerun.divergence || {};
  return h("div", { class: "rerun-verdict diverges" },
    h("p", {}, "Diverges from the recording", d.seq ? [" at ", link(d.seq)] : [" of ", link(null)],
      d.kind ? ` (${d.kind})` : "", ":"),
    h("pre", { class: "error-message" }, d.message || ""));
}
