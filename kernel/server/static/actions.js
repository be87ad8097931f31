// The commands a run's state allows (DESIGN §6), sent through the API: reply to a waiting node
// (a form from its JSON Schema), answer an agent's ask_human, send to a live node run, pause,
// resume with a message, abort with a reason, retry. A refusal shows the API's own reason.

import { ApiError, post } from "./api.js";
import { h, replaceChildren, uid } from "./dom.js";
import { schemaForm } from "./schemaform.js";

/** Which commands each run status allows (the server judges again; this only picks the controls). */
const ALLOWED = {
  queued: ["abort"],
  running: ["send", "pause", "abort"],
  waiting: ["reply", "send", "abort"],
  paused: ["resume", "abort"],
  failed: ["retry", "resume"],
  // Stored as running, but its executor (a `flowkernel run` process) is gone: the API cannot hand
  // such a run to its workers, so the page says how to continue it (see update()).
  interrupted: ["abort"],
  completed: [],
  aborted: [],
};

function promptText(prompt) {
  if (prompt === null || prompt === undefined) return "";
  return typeof prompt === "string" ? prompt : JSON.stringify(prompt, null, 2);
}

/** Live node runs a message can go to: running or waiting nodes, and running forEach items. */
function liveNodeRuns(snapshot) {
  const out = [];
  for (const [nodeId, status] of Object.entries(snapshot.nodeStatus || {})) {
    if (status !== "running" && status !== "waiting") continue;
    const items = (snapshot.forEach || {})[nodeId];
    if (items && Object.keys(items.running || {}).length) {
      for (const [index, runId] of Object.entries(items.running)) out.push({ nodeId, runId, label: `${nodeId} item ${index}` });
    } else if ((snapshot.nodeRuns || {})[nodeId]) {
      out.push({ nodeId, runId: snapshot.nodeRuns[nodeId], label: `${nodeId} (${status})` });
    }
  }
  return out;
}

export class Actions {
  constructor({ runId, flow, onCommand }) {
    this.runId = runId;
    this.nodeTypes = new Map((flow.nodes || []).map((n) => [n.id, n.type]));
    this.onCommand = onCommand;
    this.key = null;
    this.body = h("div", { class: "actions-body" });
    this.status = h("p", { class: "outcome", role: "status", "aria-live": "polite" });
    this.alert = h("div", { class: "refusal", role: "alert", hidden: true });
    this.element = h("section", { class: "actions", "aria-labelledby": "actions-title" },
      h("h2", { id: "actions-title" }, "Actions"), this.alert, this.status, this.body);
  }

  /** The flow the run follows now (it changes when the run is continued on an updated flow). */
  useFlow(flow) {
    this.nodeTypes = new Map((flow.nodes || []).map((n) => [n.id, n.type]));
  }

  /** Re-render for a new live snapshot, unless the state that decides the controls is unchanged (so
   * a half-typed answer survives events that change nothing here). Returns whether it re-rendered. */
  update(detail) {
    const snap = detail.snapshot;
    const live = liveNodeRuns(snap);
    const key = JSON.stringify([detail.run.status, detail.run.pooled,
      Object.entries(snap.waiting || {}).map(([n, w]) => [n, w.runId]), live.map((l) => l.runId)]);
    if (key === this.key) return false;
    this.key = key;
    const allowed = ALLOWED[detail.run.status] || [];
    const parts = [];
    // Resume and retry hand the run to the server's workers; a run a `flowkernel run` process started
    // is not theirs (the API refuses with 409 not-pooled), so those controls are disabled and say how
    // to continue it instead. (A server that does not say `pooled` gets the controls as before.)
    const elsewhere = detail.run.pooled === false && (allowed.includes("retry") || allowed.includes("resume"));
    const noteId = elsewhere ? uid("not-pooled") : null;
    const why = (kind) => (elsewhere ? `Started by a flowkernel run process, not queued for this server's workers: ` +
      `continue it from a terminal with flowkernel ${kind} ${this.runId}` : null);
    if (elsewhere) {
      const commands = ["retry", "resume"].filter((k) => allowed.includes(k))
        .map((k) => h("code", {}, `flowkernel ${k} ${this.runId}`));
      const joined = commands.flatMap((c, i) => (i ? [" or ", c] : [c]));
      parts.push(h("p", { class: "not-pooled-note", id: noteId }, "A ", h("code", {}, "flowkernel run"),
        " process started this run, not the server's workers, so this page cannot continue it: ", ...joined,
        " does, from a terminal."));
    }
    if (detail.run.status === "interrupted") {
      parts.push(h("p", { class: "interrupted-note" }, "No process executes this run any more: the one that ran it " +
        "stopped. ", h("code", {}, `flowkernel resume ${this.runId}`), " continues it where it stopped."));
    }
    if (allowed.includes("reply")) {
      for (const [nodeId, waiting] of Object.entries(snap.waiting || {})) parts.push(this.replyCard(nodeId, waiting));
    }
    // A waiting node run has its reply form above; send is for the ones still running whose node
    // reads messages (the server refuses a send to any other).
    const nodes = detail.nodes || {};
    const sendable = live.filter((l) => !(snap.waiting || {})[l.nodeId] && (nodes[l.nodeId] || {}).takesMessages !== false);
    if (allowed.includes("send") && sendable.length) parts.push(this.sendForm(sendable));
    const buttons = h("div", { class: "buttons" });
    if (allowed.includes("pause")) buttons.append(this.button("Pause", "pause", () => ({})));
    if (allowed.includes("retry")) {
      buttons.append(this.button("Retry failed nodes", "retry", () => ({}), { why: why("retry"), noteId }));
    }
    if (buttons.childElementCount) parts.push(buttons);
    const pause = snap.budgetPause;
    const spent = pause && typeof pause === "object" && typeof pause.limitUsd === "number" ? `$${pause.limitUsd}` : null;
    if (allowed.includes("resume")) parts.push(this.resumeForm({ why: why("resume"), noteId }, spent));
    if (allowed.includes("abort")) parts.push(this.abortForm());
    if (!parts.length) {
      parts.push(h("p", { class: "empty" }, detail.run.status === "completed" || detail.run.status === "aborted"
        ? `The run is ${detail.run.status}: no command applies.` : "No command applies now."));
    }
    replaceChildren(this.body, parts);
    return true;
  }

  /** Whether a node waits for an answer from the page (then the actions come first). */
  get asksForReply() {
    return Boolean(this.body.querySelector(".card.waiting"));
  }

  async command(kind, body, controls) {
    controls.forEach((c) => { c.disabled = true; });
    this.alert.hidden = true;
    this.status.textContent = `Sending ${kind}…`;
    try {
      const answer = await post(`/runs/${encodeURIComponent(this.runId)}/${kind}`, body);
      this.status.textContent = `${kind} accepted (event #${answer.seq}).`;
      this.onCommand(kind);
      return true;
    } catch (error) {
      this.status.textContent = "";
      this.showRefusal(kind, error);
      return false;
    } finally {
      controls.forEach((c) => { c.disabled = false; });
    }
  }

  showRefusal(kind, error) {
    const problem = error instanceof ApiError ? error.problem : { title: "Error", detail: String(error) };
    const status = error instanceof ApiError && error.status ? ` (${error.status})` : "";
    replaceChildren(this.alert,
      h("p", {}, h("strong", {}, `${kind} refused${status}: `), problem.detail || problem.title),
      (problem.errors || []).length
        ? h("ul", {}, problem.errors.map((e) => h("li", {}, h("code", {}, e.path), ` ${e.message}`))) : null);
    this.alert.hidden = false;
  }

  button(label, kind, body, unavailable = {}) {
    const b = h("button", { type: "button", class: kind === "pause" ? "" : "primary" }, label);
    b.addEventListener("click", () => this.command(kind, body(), [b]));
    return unavailable.why ? disable(b, unavailable) : b;
  }

  replyCard(nodeId, waiting) {
    const type = this.nodeTypes.get(nodeId);
    const title = h("h3", {}, `${nodeId} is waiting`);
    if (type === "flow.call" && waiting.prompt && waiting.prompt.childRunId) {
      return h("div", { class: "card waiting", dataset: { node: nodeId } }, title,
        h("p", {}, "Its child run waits for a reply: ",
          h("a", { href: `#/runs/${encodeURIComponent(waiting.prompt.childRunId)}` }, waiting.prompt.childRunId), "."));
    }
    const agent = type === "claude.agent";
    const form = schemaForm(waiting.schema, { label: agent ? "Your answer" : "Reply" });
    const submit = h("button", { type: "submit", class: "primary" }, agent ? "Answer" : "Send reply");
    const formEl = h("form", { class: "reply-form", novalidate: true, "aria-label": `reply to ${nodeId}` },
      form.element, h("div", { class: "buttons" }, submit));
    formEl.addEventListener("submit", async (event) => {
      event.preventDefault();
      const got = form.read();
      if (!got.ok) return;
      await this.command("reply", { to: waiting.runId, content: got.value }, [submit]);
    });
    return h("div", { class: "card waiting", dataset: { node: nodeId } }, title,
      h("p", { class: "prompt-label" }, agent ? "The agent asks (ask_human):" : "It asks:"),
      h("pre", { class: "value prompt" }, promptText(waiting.prompt)), formEl);
  }

  sendForm(live) {
    const selectId = uid("send-to");
    const textId = uid("send-text");
    const select = h("select", { id: selectId, name: "to" }, live.map((l) => h("option", { value: l.runId }, l.label)));
    const text = h("textarea", { id: textId, name: "message", rows: 2, required: true });
    const submit = h("button", { type: "submit" }, "Send");
    const form = h("form", { class: "send-form", novalidate: true, "aria-label": "send a message to a node run" },
      h("h3", {}, "Send a message"),
      h("div", { class: "field" }, h("label", { for: selectId }, "To node run"), select),
      h("div", { class: "field" }, h("label", { for: textId }, "Message"), text),
      h("div", { class: "buttons" }, submit));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (!text.value.trim()) {
        this.showRefusal("send", new Error("write a message first"));
        text.focus();
        return;
      }
      if (await this.command("send", { to: select.value, message: text.value }, [submit])) text.value = "";
    });
    return form;
  }

  resumeForm(unavailable = {}, budgetPaused = null) {
    const id = uid("resume");
    const budgetId = uid("budget");
    const input = h("input", { id, name: "message", type: "text", placeholder: "continue" });
    // `resume --budget USD`: the new limit for what paused the run for its budget (or the run's budget).
    const budget = h("input", { id: budgetId, name: "budget", type: "number", min: "0", step: "any", inputmode: "decimal",
      placeholder: budgetPaused ? `more than ${budgetPaused}` : "unchanged", class: "budget" });
    const submit = h("button", { type: "submit", class: "primary" }, "Resume");
    const form = h("form", { class: "resume-form inline-form", "aria-label": "resume the run", novalidate: true },
      h("label", { for: id }, "Resume with a message"), input,
      h("label", { for: budgetId }, "Budget (USD)"), budget, submit);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const body = input.value.trim() ? { message: input.value } : {};
      if (budget.value.trim() !== "") {
        const usd = Number(budget.value);
        if (!Number.isFinite(usd) || usd <= 0) {
          this.showRefusal("resume", new Error("the budget must be a number of US dollars above 0"));
          budget.setAttribute("aria-invalid", "true");
          budget.focus();
          return;
        }
        budget.removeAttribute("aria-invalid");
        body.budget = usd;
      }
      this.command("resume", body, [submit]);
    });
    if (unavailable.why) {
      disable(input, unavailable);
      disable(budget, unavailable);
      disable(submit, unavailable);
    }
    return form;
  }

  abortForm() {
    const id = uid("abort");
    const input = h("input", { id, name: "reason", type: "text", placeholder: "why (optional)" });
    const submit = h("button", { type: "submit", class: "danger" }, "Abort run");
    const form = h("form", { class: "abort-form inline-form", "aria-label": "abort the run" },
      h("label", { for: id }, "Abort with a reason"), input, submit);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.command("abort", input.value.trim() ? { reason: input.value } : {}, [submit]);
    });
    return form;
  }
}

/** ``control`` disabled for ``why`` (its tooltip), described by the note with id ``noteId``. */
function disable(control, { why, noteId }) {
  control.disabled = true;
  control.title = why;
  if (noteId) control.setAttribute("aria-describedby", noteId);
  return control;
}
