// Each agent run's stored conversation: every message (system, user, assistant with its tool uses,
// tool results) and every tool call, from the agent history API, loaded when it is opened.

import { allItems, api, ApiError } from "./api.js";
import { h, replaceChildren } from "./dom.js";
import { cost, datetime, duration, preview, valueBlock } from "./format.js";

function block(b) {
  switch (b && b.type) {
    case "text":
      return h("div", { class: "block block-text" }, valueBlock(b.text, { className: "prose" }));
    case "thinking":
      return h("details", { class: "block block-thinking" }, h("summary", {}, "thinking"),
        valueBlock(b.thinking, { className: "prose" }));
    case "redacted_thinking":
      return h("p", { class: "block block-thinking" }, "thinking (redacted by the API)");
    case "tool_use":
      return h("div", { class: "block block-tool-use" },
        h("p", { class: "block-head" }, "tool use ", h("strong", {}, b.name), " ", h("code", {}, b.id)),
        valueBlock(b.input));
    case "tool_result": {
      const content = Array.isArray(b.content)
        ? b.content.map((c) => (c.type === "text" ? c.text : JSON.stringify(c))).join("\n") : b.content;
      return h("div", { class: `block block-tool-result${b.is_error ? " failed" : ""}` },
        h("p", { class: "block-head" }, b.is_error ? "tool error for " : "tool result for ", h("code", {}, b.tool_use_id)),
        valueBlock(content, { className: "prose" }));
    }
    default:
      return h("div", { class: "block" }, valueBlock(b));
  }
}

function contentOf(content) {
  if (typeof content === "string") return [block({ type: "text", text: content })];
  if (Array.isArray(content)) return content.map(block);
  return [valueBlock(content)];
}

/** A disclosure that loads a resource of the API when it is first opened. */
function onDemand(label, path) {
  const body = h("div", { class: "on-demand" });
  const details = h("details", { class: "raw" }, h("summary", {}, label), body);
  let loaded = false;
  details.addEventListener("toggle", async () => {
    if (!details.open || loaded) return;
    loaded = true;
    body.textContent = "Loading…";
    try {
      replaceChildren(body, valueBlock(await api(path)));
    } catch (error) {
      loaded = false;
      replaceChildren(body, h("p", { class: "error-text" }, error.message));
    }
  });
  return details;
}

export class Agents {
  constructor() {
    this.runs = new Map(); // agent run (node run) id -> entry
    this.resumed = new Map(); // node run id -> the interrupted node run it continues
    this.list = h("div", { class: "agent-runs" });
    this.empty = h("p", { class: "empty" }, "No agent has run in this run yet.");
    this.element = h("div", { class: "agents" }, this.empty, this.list);
  }

  /** Follow the run's events: agent runs appear as they start, and open ones reload as they change. */
  add(event) {
    if (event.type === "node:start" && event.resumedFrom) this.resumed.set(event.runId, event.resumedFrom);
    if (event.type === "agent:start" && event.runId && !this.runs.has(event.runId)) {
      this.register(event);
      return;
    }
    const entry = event.runId ? this.runs.get(event.runId) : null;
    if (!entry) return;
    const status = {
      "agent:complete": "completed", "agent:error": "failed", "node:waiting": "waiting", "node:error": "failed",
      "node:start": "running",
    }[event.type];
    if (status) this.setStatus(entry, status);
    if (event.type === "agent:complete") entry.cost.textContent = cost(event.totalCostUsd ?? 0);
    if (entry.details.open && /^(agent:(text|tool|complete|error)|node:(waiting|complete))$/.test(event.type)) {
      this.reloadSoon(entry);
    }
  }

  register(event) {
    this.empty.hidden = true;
    const status = h("span", { class: "badge st-running" }, "running");
    const costLabel = h("span", { class: "cost" });
    const body = h("div", { class: "agent-body" }, h("p", { class: "loading" }, "Loading…"));
    const details = h("details", { class: "agent-run", dataset: { agentRun: event.runId, node: event.nodeId } },
      h("summary", {}, h("strong", {}, event.nodeId), " ", h("code", {}, event.runId), " ",
        h("span", { class: "model" }, event.model), " ", status, " ", costLabel,
        this.resumed.has(event.runId)
          ? h("span", { class: "continues" }, " continues ", h("code", {}, this.resumed.get(event.runId))) : null),
      body);
    const entry = { id: event.runId, nodeId: event.nodeId, details, body, status, cost: costLabel, loaded: false,
      timer: null };
    details.addEventListener("toggle", () => {
      if (details.open && !entry.loaded) this.load(entry);
    });
    this.runs.set(event.runId, entry);
    this.list.append(details);
  }

  setStatus(entry, status) {
    entry.status.className = `badge st-${status === "completed" ? "done" : status}`;
    entry.status.textContent = status;
  }

  reloadSoon(entry) {
    clearTimeout(entry.timer);
    entry.timer = setTimeout(() => this.load(entry), 400);
  }

  /** Open the conversation of the latest agent run of nodeId (or a given agent run). */
  open(nodeIdOrRun) {
    const entries = [...this.runs.values()].filter((e) => e.id === nodeIdOrRun || e.nodeId === nodeIdOrRun);
    const entry = entries[entries.length - 1];
    if (!entry) return false;
    entry.details.open = true;
    entry.details.scrollIntoView({ block: "nearest" });
    return true;
  }

  async load(entry) {
    entry.loaded = true;
    const id = encodeURIComponent(entry.id);
    try {
      const [messages, calls] = await Promise.all([
        allItems(`/agent-runs/${id}/messages`), allItems(`/agent-runs/${id}/tool-calls`)]);
      replaceChildren(entry.body, this.conversation(entry, messages), this.toolCalls(entry, calls));
    } catch (error) {
      entry.loaded = false;
      const text = error instanceof ApiError && error.status === 404
        ? "Nothing is stored for this agent run yet." : `Could not load the conversation: ${error.message}`;
      replaceChildren(entry.body, h("p", { class: "empty" }, text),
        h("button", { type: "button", onclick: () => this.load(entry) }, "Try again"));
    }
  }

  conversation(entry, messages) {
    const id = encodeURIComponent(entry.id);
    return h("section", { class: "conversation" },
      h("h3", {}, `Conversation (${messages.length} message${messages.length === 1 ? "" : "s"})`),
      h("ol", { class: "messages" }, messages.map((m) => h("li", { class: `message role-${m.role}`, dataset: { message: m.messageId } },
        h("p", { class: "message-head" }, h("span", { class: "role" }, m.role), ` · step ${m.step} · `,
          h("time", {}, datetime(m.createdAt))),
        contentOf(m.content),
        onDemand("stored JSON", `/agent-runs/${id}/messages/${m.messageId}`)))));
  }

  toolCalls(entry, calls) {
    const id = encodeURIComponent(entry.id);
    if (!calls.length) return h("section", { class: "tool-calls" }, h("h3", {}, "Tool calls"), h("p", { class: "empty" }, "None."));
    return h("section", { class: "tool-calls" },
      h("h3", {}, `Tool calls (${calls.length})`),
      h("div", { class: "table-scroll" }, h("table", {},
        h("thead", {}, h("tr", {}, ["Tool", "Duration", "Step", "Input", "Output"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, calls.map((c) => h("tr", { class: c.status === "error" ? "failed" : "", dataset: { toolCall: c.toolCallId } },
          h("td", { class: "tool-cell" }, h("strong", { class: "tool-name" }, c.toolName), " ",
            h("span", { class: `badge st-${c.status === "error" ? "failed" : "done"}` }, c.status),
            onDemand("stored JSON", `/agent-runs/${id}/tool-calls/${c.toolCallId}`)),
          h("td", { class: "num" }, duration(c.durationMs)),
          h("td", { class: "num" }, String(c.step)),
          h("td", { class: "io" }, h("details", {}, h("summary", {}, preview(c.input, 60)), valueBlock(c.input))),
          h("td", { class: "io" }, h("details", {}, h("summary", {}, preview(c.output, 60)), valueBlock(c.output)))))))));
  }
}
