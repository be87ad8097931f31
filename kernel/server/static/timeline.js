// The live timeline of a run's events: run-level events in order, and everything a node run does
// (its agent's text and thinking as they stream, its tool calls, errors, waits) nested under it.

import { h } from "./dom.js";
import { duration, clock, cost, preview, usage, valueBlock } from "./format.js";

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

export class Timeline {
  constructor({ onPickSeq }) {
    this.onPickSeq = onPickSeq;
    this.list = h("ol", { class: "timeline", "aria-label": "events" });
    this.element = h("div", { class: "timeline-scroll", tabindex: 0, "aria-label": "timeline of events" }, this.list);
    this.groups = new Map(); // node run id -> group
    this.rows = []; // [{el, seq}] for marking the snapshot position
    this.t0 = null;
    this.lastSeq = 0;
    this.follow = true;
    this.scrollPending = false;
    this.element.addEventListener("scroll", () => {
      const el = this.element;
      this.follow = el.scrollTop + el.clientHeight >= el.scrollHeight - 32;
    });
  }

  row(event, kind, text, extra = []) {
    const li = h("li", { class: `ev ev-${kind}${MINOR.has(event.type) ? " minor" : ""}`, dataset: { seq: event.seq } },
      h("div", { class: "ev-line" },
        seqButton(event.seq, this.onPickSeq),
        h("span", { class: "ev-time", title: clock(event.timestamp) }, this.relative(event.timestamp)),
        h("span", { class: "ev-type" }, event.type),
        h("span", { class: "ev-text" }, text)),
      extra);
    this.rows.push({ el: li, seq: event.seq });
    return li;
  }

  relative(timestamp) {
    if (this.t0 === null) this.t0 = timestamp;
    return `+${duration(timestamp - this.t0)}`;
  }

  /** Add one event (in seq order, as the stream delivers them). */
  add(event) {
    if (event.seq <= this.lastSeq) return; // a reconnect never repeats, but be safe
    this.lastSeq = event.seq;
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
    // A streamed block ends where the node run does something else (a complete block may follow or not).
    if (g.text && e.type !== "agent:text:delta" && e.type !== "agent:text") this.endBlock(g, "text");
    if (g.thinking && e.type !== "agent:thinking:delta" && e.type !== "agent:thinking") this.endBlock(g, "thinking");
    switch (e.type) {
      case "node:start":
        this.setStatus(g, "running");
        add(this.row(e, "start", `started${e.attempt ? `, attempt ${e.attempt}` : ""}` +
          `${e.resumedFrom ? ` (resumes ${e.resumedFrom})` : ""}`, [disclosure("input", e.input)]));
        break;
      case "node:complete":
        this.setStatus(g, "done");
        if (e.durationMs >= 0) g.took.textContent = duration(e.durationMs);
        add(this.row(e, "complete", `done in ${duration(e.durationMs ?? 0)}`, [disclosure("output", e.output)]));
        break;
      case "node:error":
        this.setStatus(g, "failed", e.willRetry ? "failed, will retry" : "failed");
        add(this.row(e, "error", `${e.errorType}: ${e.message}` + `${e.willRetry ? " (will retry)" : ""}`));
        break;
      case "node:waiting":
        this.setStatus(g, "waiting");
        if (e.prompt && typeof e.prompt === "object" && e.prompt.childRunId) {
          add(this.row(e, "waiting", ["waiting on its child run ", h("a", {
            href: `#/runs/${encodeURIComponent(e.prompt.childRunId)}` }, e.prompt.childRunId)]));
        } else {
          add(this.row(e, "waiting", "waiting for a reply", [h("pre", { class: "value prompt" }, textOf(e.prompt))]));
        }
        break;
      case "agent:start":
        add(this.row(e, "agent", `agent on ${e.model}`, [disclosure("prompt", e.prompt)]));
        break;
      case "agent:text:delta":
      case "agent:thinking:delta": {
        const key = e.type === "agent:text:delta" ? "text" : "thinking";
        if (!g[key]) g[key] = this.streamBlock(e, key);
        g[key].pre.append(e.content);
        break;
      }
      case "agent:text":
      case "agent:thinking": {
        const key = e.type === "agent:text" ? "text" : "thinking";
        const block = g[key] || this.streamBlock(e, key);
        block.pre.textContent = e.content;
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
        add(this.row(e, "tool", e.error ? "tool call failed" : "tool call", [tool]));
        break;
      }
      case "agent:error":
        add(this.row(e, "error", `${e.errorType}: ${e.message}`,
          e.details !== undefined && e.details !== null ? [disclosure("details", e.details, true)] : []));
        break;
      case "agent:usage":
        add(this.row(e, "usage", `${e.model} · ${usage(e.usage)} · ${cost(e.costUsd ?? 0)}`));
        break;
      case "agent:complete":
        add(this.row(e, "agent-done", `agent finished: ${e.numTurns ?? 0} turn${e.numTurns === 1 ? "" : "s"} · ` +
          `${cost(e.totalCostUsd ?? 0)} · ${duration(e.durationMs ?? 0)}`,
        e.structuredOutput !== undefined && e.structuredOutput !== null
          ? [disclosure("structured output", e.structuredOutput)] : []));
        break;
      case "inbox:consumed":
        add(this.row(e, "inbox", `took ${e.count} inbox message${e.count === 1 ? "" : "s"}`));
        break;
      case "command:received":
        add(this.commandRow(e));
        break;
      default:
        add(this.row(e, "other", preview(e, 100)));
    }
  }

  endBlock(g, key) {
    g[key].li.classList.remove("streaming");
    g[key] = null;
  }

  streamBlock(e, key) {
    const pre = h("pre", { class: `agent-${key}` });
    const li = this.row({ ...e, type: `agent:${key}` }, key, key === "text" ? "agent text" : "thinking", [pre]);
    li.classList.add("streaming");
    const target = this.groups.get(e.runId);
    target.body.append(li);
    return { li, pre };
  }

  commandRow(e) {
    const verdict = e.accepted ? "accepted" : "refused";
    const text = `${e.command} ${verdict}${e.reason ? `: ${e.reason}` : ""}`;
    const content = e.content !== undefined && e.content !== null ? e.content : e.contentPreview;
    const li = this.row(e, e.accepted ? "command" : "refused", text,
      content !== undefined && content !== null ? [h("pre", { class: "value" }, textOf(content))] : []);
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
      case "flow:complete":
        this.interruptRunning();
        return this.row(e, e.status === "completed" ? "flow" : "error",
          `run ${e.status}${e.error ? `: ${e.error}` : ""}`);
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

  /** Dim what happened after seq (null: nothing) and mark the row of seq. */
  markAt(seq) {
    for (const { el, seq: s } of this.rows) {
      el.classList.toggle("future", seq !== null && s > seq);
      el.classList.toggle("current", seq !== null && s === seq);
    }
    if (seq !== null) {
      const current = this.rows.find((r) => r.seq === seq);
      if (current) current.el.scrollIntoView({ block: "nearest" });
    }
  }

  /** Scroll to the latest node run of nodeId and open it. */
  showNode(nodeId) {
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
