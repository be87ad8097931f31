// The flows of the server's --flows folders (GET /flows): each one's name, description and inputs,
// and a form that starts a run of it (POST /runs), built from its `inputs` JSON Schema by the same
// code as the reply forms, with JSON for what a form cannot express and an optional idempotency key.
// The new run opens at once, live.

import { allItems, ApiError, post } from "./api.js";
import { h, replaceChildren, uid } from "./dom.js";
import { schemaForm } from "./schemaform.js";

function hasFields(schema) {
  return Boolean(schema && typeof schema === "object" && schema.type === "object" && schema.properties
    && Object.keys(schema.properties).length);
}

function inputsSummary(schema) {
  if (!hasFields(schema)) return "any JSON (the flow has no `inputs` schema)";
  const required = new Set(schema.required || []);
  return Object.keys(schema.properties).map((k) => (required.has(k) ? `${k} *` : k)).join(", ");
}

export class FlowsPage {
  constructor(params, selected = null) {
    this.selected = selected;
    this.list = h("div", { class: "flow-list" });
    this.message = h("div", { class: "page-message", role: "status" });
    this.element = h("div", { class: "flows-page" },
      h("div", { class: "page-head" }, h("h1", {}, "Flows")),
      h("p", { class: "hint" }, "The flows in this server's ", h("code", {}, "--flows"), " folders. Start a run of one " +
        "from its form; the run opens as it goes."),
      this.message, this.list);
  }

  update() {
    return false; // another flow selected: the page is drawn again
  }

  async start() {
    try {
      const flows = await allItems("/flows");
      this.render(flows);
    } catch (error) {
      replaceChildren(this.message, h("p", { class: "error-text" },
        error instanceof ApiError ? `Could not list the flows: ${error.message}` : String(error)));
    }
  }

  render(flows) {
    if (!flows.length) {
      replaceChildren(this.list, h("p", { class: "empty" }, "This server has no flows to start by name: give it ",
        h("code", {}, "flowkernel serve --flows DIR"), ", or start runs with POST /api/v1/runs and a flowDocument."));
      return;
    }
    replaceChildren(this.list, flows.map((flow) => this.card(flow)));
    const open = this.list.querySelector(".flow-card.selected");
    if (open) {
      open.scrollIntoView({ block: "nearest" });
      open.querySelector("input, textarea, select, button[type=submit]")?.focus();
    }
  }

  card(flow) {
    const selected = flow.name === this.selected;
    const link = h("a", { class: "button-link", href: selected ? "#/flows" : `#/flows/${encodeURIComponent(flow.name)}`,
      "aria-expanded": String(selected) }, selected ? "Close" : "Start a run");
    return h("section", { class: `flow-card card${selected ? " selected" : ""}`, dataset: { flow: flow.name },
      "aria-label": `flow ${flow.name}` },
    h("div", { class: "flow-head" }, h("h2", {}, flow.name), link),
    flow.description ? h("p", { class: "description" }, flow.description) : null,
    h("p", { class: "inputs-summary" }, h("span", { class: "label" }, "Inputs: "), inputsSummary(flow.inputs)),
    selected ? this.startForm(flow) : null);
  }

  startForm(flow) {
    const fields = hasFields(flow.inputs) ? schemaForm(flow.inputs, { label: "Input" }) : null;
    const jsonId = uid("input-json");
    const keyId = uid("idempotency");
    const json = h("textarea", { id: jsonId, name: "input-json", rows: 5, class: "json", spellcheck: "false" });
    json.value = "{}";
    const asJson = h("details", { class: "as-json", open: !fields },
      h("summary", {}, fields ? "Give the input as JSON instead" : "Input (JSON)"),
      h("label", { for: jsonId }, "The run's input, a JSON value"), json);
    asJson.addEventListener("toggle", () => {
      if (!asJson.open || !fields) return;
      const got = fields.read(); // the form's answer so far, as a start for the JSON
      if (got.ok) json.value = JSON.stringify(got.value, null, 2);
    });
    const key = h("input", { id: keyId, name: "idempotencyKey", type: "text", autocomplete: "off", maxlength: 200 });
    const problem = h("div", { class: "refusal", role: "alert", hidden: true });
    const submit = h("button", { type: "submit", class: "primary" }, "Start run");
    const form = h("form", { class: "start-form", novalidate: true, "aria-label": `start a run of ${flow.name}` },
      fields ? fields.element : null, asJson,
      h("div", { class: "field" }, h("label", { for: keyId }, "Idempotency key (optional)"), key,
        h("p", { class: "hint" }, "The same key again opens the run it started instead of starting another.")),
      problem, h("div", { class: "buttons" }, submit));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      problem.hidden = true;
      let input;
      if (asJson.open || !fields) {
        try {
          input = JSON.parse(json.value.trim() || "null");
        } catch (error) {
          this.refuse(problem, `The input is not valid JSON: ${error.message}`);
          json.setAttribute("aria-invalid", "true");
          json.focus();
          return;
        }
        json.removeAttribute("aria-invalid");
      } else {
        const got = fields.read();
        if (!got.ok) return;
        input = got.value;
      }
      const body = { flow: flow.name, input };
      if (key.value.trim()) body.idempotencyKey = key.value.trim();
      submit.disabled = true;
      try {
        const run = await post("/runs", body);
        location.hash = `#/runs/${encodeURIComponent(run.runId)}`;
      } catch (error) {
        const detail = error instanceof ApiError ? error.problem : { detail: String(error) };
        this.refuse(problem, `Not started${error.status ? ` (${error.status})` : ""}: ${detail.detail || detail.title}`,
          detail.errors || []);
      } finally {
        submit.disabled = false;
      }
    });
    return form;
  }

  refuse(where, text, errors = []) {
    replaceChildren(where, h("p", {}, text),
      errors.length ? h("ul", {}, errors.map((e) => h("li", {}, h("code", {}, e.path), ` ${e.message}`))) : null);
    where.hidden = false;
  }

  dispose() {}
}
