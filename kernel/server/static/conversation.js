// Each agent run's stored conversation: every message (system, user, assistant with its tool uses,
// tool results) and every tool call, from the agent history API, loaded when it is opened.

import { allItems, api, ApiError } from "./api.js";
import { h, replaceChildren } from "./dom.js";
import { cost, datetime, duration, preview, valueBlock } from "./format.js";
import { markdown } from "./markdown.js";

function block(b) {
  switch (b && b.type) {
    case "text":
      return h("div", { class: "block block-text" }, markdown(b.text));
    case "thinking":
      return h("details", { class: "block block-thinking" }, h("summary", {}, "thinking"),
        valueBlock(b.thinking, { className: "prose" }));
    case "redacted_thinking":
      return h("p", { class: "block block-thinking" }, "thinking (redacted by the API)");
    case "compaction":
      // What the API summarized the conversation before it into; later requests start here.
      return h("details", { class: "block block-compaction" },
        h("summary", {}, b.content == null ? "compaction (it failed: no summary)"
          : "compaction: the conversation before this was summarized"),
        valueBlock(b.content ?? "", { className: "prose" }));
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
  /** runId: the run whose agent runs these are (GET /agent-runs?runId=…). */
  constructor(runId) {
    this.runId = runId;
    this.runs = new Map(); // agent run (node run) id -> entry
    this.models = new Map(); // agent run id -> model, from its agent:start
    this.timer = null;
    this.fetching = false;
    this.again = false;
    this.list = h("div", { class: "agent-runs" });
    this.empty = h("p", { class: "empty" }, "No agent has run in this run yet.");
    this.problem = h("p", { class: "error-text", hidden: true });
    this.element = h("div", { class: "agents" }, this.empty, this.problem, this.list);
  }

  /** Follow the run's events. The agent runs themselves (status, steps, cost) come from the API's own
   * fold of the events, GET /agent-runs, re-read when an event may have changed them: the page keeps
   * no rules of its own about when an agent run is interrupted or done. */
  add(event) {
    if (event.type === "agent:start" && event.runId) this.models.set(event.runId, event.model);
    const entry = event.runId ? this.runs.get(event.runId) : null;
    if (entry && entry.details.open && /^(agent:(text|tool|complete|error)|node:(waiting|complete))$/.test(event.type)) {
      this.reloadSoon(entry);  // an open conversation grows as it is stored
    }
    if (/^(agent:(start|complete|error|tool|text|usage)|node:(start|waiting|complete|error)|flow:)/.test(event.type)) {
      this.refreshSoon();
    }
  }

  refreshSoon() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.refresh(), 200);
  }

  async refresh() {
    if (this.fetching) {
      this.again = true;
      return;
    }
    this.fetching = true;
    try {
      const items = await allItems("/agent-runs", { runId: this.runId });
      this.problem.hidden = true;
      items.sort((a, b) => a.createdAt - b.createdAt || (a.agentRunId < b.agentRunId ? -1 : 1));
      for (const item of items) this.show(item);
    } catch (error) {
      this.problem.hidden = false;
      this.problem.textContent = `Could not list the agent runs: ${error.message}`;
    } finally {
      this.fetching = false;
    }
    if (this.again) {
      this.again = false;
      this.refreshSoon();
    }
  }

  show(item) {
    let entry = this.runs.get(item.agentRunId);
    if (!entry) entry = this.register(item);
    const changed = entry.seen !== `${item.status}/${item.stepCount}`;
    entry.seen = `${item.status}/${item.stepCount}`;
    entry.status.className = `badge st-${item.status === "completed" ? "done" : item.status}`;
    entry.status.textContent = item.status;
    entry.model.textContent = this.models.get(item.agentRunId) || "";
    entry.steps.textContent = `${item.stepCount}${item.maxSteps ? `/${item.maxSteps}` : ""} steps`;
    entry.cost.textContent = cost(item.totalCostUsd ?? 0);
    entry.error.hidden = !item.errorMessage;
    entry.error.textContent = item.errorMessage || "";
    if (changed && entry.details.open) this.reloadSoon(entry);
  }

  register(item) {
    this.empty.hidden = true;
    const part = (cls) => h("span", { class: cls });
    const entry = { id: item.agentRunId, nodeId: item.agentId, status: part("badge"), model: part("model"),
      steps: part("steps"), cost: part("cost"), error: h("p", { class: "error-text agent-error", hidden: true }),
      body: h("div", { class: "agent-body" }, h("p", { class: "loading" }, "Loading…")),
      loaded: false, timer: null, seen: null };
    entry.details = h("details", { class: "agent-run", dataset: { agentRun: item.agentRunId, node: item.agentId } },
      h("summary", {}, h("strong", {}, item.agentId), " ", h("code", {}, item.agentRunId), " ", entry.model, " ",
        entry.status, " ", entry.steps, " ", entry.cost,
        item.resumedFrom ? h("span", { class: "continues" }, " continues ", h("code", {}, item.resumedFrom)) : null),
      entry.error, entry.body);
    entry.details.addEventListener("toggle", () => {
      if (entry.details.open && !entry.loaded) this.load(entry);
    });
    this.runs.set(item.agentRunId, entry);
    this.list.append(entry.details);
    return entry;
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
