// A form built from a JSON Schema, and a validator for the part of JSON Schema such forms use.
//
// The server validates every reply against the schema too (the same check as `flowkernel reply`);
// checking here first only spares a round trip and puts the message next to the field. Keywords
// this validator does not know are left to the server, whose refusal the page shows.

import { h, uid } from "./dom.js";

const typeOf = (value) => {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  return typeof value;
};

const matchesType = (value, type) => {
  const actual = typeOf(value);
  return actual === type || (type === "number" && actual === "integer");
};

const equal = (a, b) => JSON.stringify(a) === JSON.stringify(b);

const child = (path, key) => (typeof key === "number" ? `${path}[${key}]`
  : /^[A-Za-z_$][\w$]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`);

/** Every problem of value against schema, as [{path: "$.a[0]", message}]. */
export function validate(schema, value, path = "$") {
  if (schema === true || schema === undefined || schema === null) return [];
  if (schema === false) return [{ path, message: "no value is allowed here" }];
  const problems = [];
  const add = (message) => problems.push({ path, message });
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => matchesType(value, t))) {
      add(`must be ${types.map((t) => (t === "integer" ? "a whole number" : `${/^[aeiou]/.test(t) ? "an" : "a"} ${t}`)).join(" or ")}`);
      return problems;
    }
  }
  if (schema.enum && !schema.enum.some((v) => equal(v, value))) {
    add(`must be one of ${schema.enum.map((v) => JSON.stringify(v)).join(", ")}`);
  }
  if (schema.const !== undefined && !equal(schema.const, value)) add(`must be ${JSON.stringify(schema.const)}`);
  if (typeof value === "string") {
    const length = [...value].length;
    if (schema.minLength !== undefined && length < schema.minLength) {
      add(schema.minLength === 1 ? "must not be empty" : `must be at least ${schema.minLength} characters`);
    }
    if (schema.maxLength !== undefined && length > schema.maxLength) add(`must be at most ${schema.maxLength} characters`);
    if (schema.pattern !== undefined) {
      let re = null;
      try { re = new RegExp(schema.pattern, "u"); } catch { /* a pattern JS cannot read: the server checks it */ }
      if (re && !re.test(value)) add(`must match the pattern ${schema.pattern}`);
    }
  }
  if (typeof value === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) add(`must be at least ${schema.minimum}`);
    if (schema.maximum !== undefined && value > schema.maximum) add(`must be at most ${schema.maximum}`);
    if (typeof schema.exclusiveMinimum === "number" && value <= schema.exclusiveMinimum) {
      add(`must be more than ${schema.exclusiveMinimum}`);
    }
    if (typeof schema.exclusiveMaximum === "number" && value >= schema.exclusiveMaximum) {
      add(`must be less than ${schema.exclusiveMaximum}`);
    }
    if (schema.multipleOf && Math.abs(value / schema.multipleOf - Math.round(value / schema.multipleOf)) > 1e-9) {
      add(`must be a multiple of ${schema.multipleOf}`);
    }
  }
  if (Array.isArray(value)) {
    if (schema.minItems !== undefined && value.length < schema.minItems) add(`needs at least ${schema.minItems} items`);
    if (schema.maxItems !== undefined && value.length > schema.maxItems) add(`allows at most ${schema.maxItems} items`);
    if (schema.uniqueItems && new Set(value.map((v) => JSON.stringify(v))).size !== value.length) {
      add("must not repeat an item");
    }
    if (schema.items && typeof schema.items === "object") {
      value.forEach((item, i) => problems.push(...validate(schema.items, item, child(path, i))));
    }
  }
  if (typeOf(value) === "object") {
    const properties = schema.properties || {};
    for (const key of schema.required || []) {
      if (!(key in value)) problems.push({ path: child(path, key), message: "is required" });
    }
    for (const [key, item] of Object.entries(value)) {
      if (key in properties) {
        problems.push(...validate(properties[key], item, child(path, key)));
      } else if (schema.additionalProperties === false) {
        problems.push({ path: child(path, key), message: "is not an allowed property" });
      } else if (typeof schema.additionalProperties === "object") {
        problems.push(...validate(schema.additionalProperties, item, child(path, key)));
      }
    }
  }
  for (const sub of schema.allOf || []) problems.push(...validate(sub, value, path));
  if (schema.anyOf && !schema.anyOf.some((sub) => validate(sub, value, path).length === 0)) {
    add("does not match any of the allowed shapes");
  }
  if (schema.oneOf && schema.oneOf.filter((sub) => validate(sub, value, path).length === 0).length !== 1) {
    add("must match exactly one of the allowed shapes");
  }
  if (schema.not && validate(schema.not, value, path).length === 0) add("matches a shape that is not allowed");
  return problems;
}

const PRIMITIVES = new Set(["string", "number", "integer", "boolean"]);

function simpleType(schema) {
  if (!schema || typeof schema !== "object") return null;
  if (schema.enum) return "enum";
  return typeof schema.type === "string" ? schema.type : null;
}

/** One input for one value; read() returns {value, missing} or throws a message. */
function field(schema, { name, label, required, multiline = false }) {
  const id = uid("field");
  const hintId = `${id}-hint`;
  const errorId = `${id}-error`;
  const type = simpleType(schema);
  const description = schema && schema.description;
  const describedBy = [description ? hintId : null, errorId].filter(Boolean).join(" ");
  let input;
  let read;
  if (type === "enum") {
    input = h("select", { id, name, "aria-describedby": describedBy },
      required ? null : h("option", { value: "" }, "—"),
      schema.enum.map((v, i) => h("option", { value: String(i) }, typeof v === "string" ? v : JSON.stringify(v))));
    read = () => (input.value === "" ? { missing: true } : { value: schema.enum[Number(input.value)] });
  } else if (type === "boolean") {
    input = h("input", { id, name, type: "checkbox", "aria-describedby": describedBy });
    if (schema.default === true) input.checked = true;
    read = () => ({ value: input.checked });
  } else if (type === "number" || type === "integer") {
    input = h("input", { id, name, type: "number", step: type === "integer" ? "1" : "any", inputmode: "decimal",
      "aria-describedby": describedBy });
    if (schema.minimum !== undefined) input.min = schema.minimum;
    if (schema.maximum !== undefined) input.max = schema.maximum;
    read = () => {
      if (input.value.trim() === "") return { missing: true };
      const n = Number(input.value);
      if (Number.isNaN(n)) throw new Error(`must be ${type === "integer" ? "a whole number" : "a number"}`);
      return { value: n };
    };
  } else if (type === "string") {
    const long = multiline || schema.format === "textarea" || (schema.maxLength || Infinity) > 200;
    input = long ? h("textarea", { id, name, rows: multiline ? 4 : 2, "aria-describedby": describedBy })
      : h("input", { id, name, type: "text", "aria-describedby": describedBy });
    if (schema.maxLength !== undefined) input.maxLength = schema.maxLength;
    read = () => (input.value === "" ? { missing: true } : { value: input.value });
  } else if (type === "array" && schema.items && PRIMITIVES.has(simpleType(schema.items))) {
    const itemType = simpleType(schema.items);
    input = h("textarea", { id, name, rows: 3, "aria-describedby": describedBy });
    read = () => {
      const lines = input.value.split("\n").map((l) => l.trim()).filter((l) => l !== "");
      if (lines.length === 0 && !required) return { missing: true };
      return {
        value: lines.map((line) => {
          if (itemType === "string") return line;
          if (itemType === "boolean") return line === "true";
          const n = Number(line);
          if (Number.isNaN(n)) throw new Error(`“${line}” is not a number`);
          return n;
        }),
      };
    };
  } else { // anything else: JSON, checked by the validator after parsing
    input = h("textarea", { id, name, rows: 3, class: "json", spellcheck: "false", "aria-describedby": describedBy,
      placeholder: "JSON" });
    read = () => {
      if (input.value.trim() === "") return { missing: true };
      try { return { value: JSON.parse(input.value) }; } catch { throw new Error("is not valid JSON"); }
    };
  }
  if (schema && schema.default !== undefined && type !== "boolean") {
    if (type === "enum") input.value = String(schema.enum.findIndex((v) => equal(v, schema.default)));
    else if (type === "array") input.value = (schema.default || []).join("\n");
    else input.value = typeof schema.default === "string" || typeof schema.default === "number"
      ? String(schema.default) : JSON.stringify(schema.default);
  }
  if (required) input.required = true;
  const error = h("p", { class: "field-error", id: errorId, hidden: true });
  const labelText = [label, required ? h("span", { class: "required", "aria-hidden": "true" }, " *") : null];
  const wrapper = type === "boolean"
    ? h("div", { class: "field checkbox" }, input, h("label", { for: id }, labelText))
    : h("div", { class: "field" }, h("label", { for: id }, labelText), input);
  if (description) wrapper.append(h("p", { class: "hint", id: hintId }, description));
  wrapper.append(error);
  const setError = (message) => {
    error.hidden = !message;
    error.textContent = message ? `${label} ${message}` : "";
    if (message) input.setAttribute("aria-invalid", "true");
    else input.removeAttribute("aria-invalid");
  };
  return { element: wrapper, input, read, setError };
}

/**
 * A form body for schema. Returns {element, read()} where read() gives {ok: true, value} or
 * {ok: false, problems} and marks each problem at its field (focusing the first).
 * Without a schema the answer is free text.
 */
export function schemaForm(schema, { label = "Answer" } = {}) {
  const effective = schema && typeof schema === "object" ? schema : { type: "string" };
  const fields = new Map(); // JSON path -> field
  const keys = new Map(); // JSON path -> property name
  let element;
  let collect;
  if (simpleType(effective) === "object" && effective.properties) {
    const required = new Set(effective.required || []);
    element = h("fieldset", { class: "schema-form" },
      effective.title ? h("legend", {}, effective.title) : null);
    for (const [key, sub] of Object.entries(effective.properties)) {
      const f = field(sub, { name: key, label: (sub && sub.title) || key, required: required.has(key) });
      fields.set(child("$", key), f);
      keys.set(child("$", key), key);
      element.append(f.element);
    }
    collect = () => {
      const value = {};
      const problems = [];
      for (const [path, f] of fields) {
        try {
          const got = f.read();
          if (!got.missing) value[keys.get(path)] = got.value;
        } catch (error) {
          problems.push({ path, message: error.message });
        }
      }
      return { value, problems };
    };
  } else {
    const f = field(effective, { name: "answer", label, required: true, multiline: true });
    fields.set("$", f);
    element = h("div", { class: "schema-form" }, f.element);
    collect = () => {
      try {
        const got = f.read();
        return { value: got.missing ? undefined : got.value, problems: [] };
      } catch (error) {
        return { value: undefined, problems: [{ path: "$", message: error.message }] };
      }
    };
  }
  const read = () => {
    for (const f of fields.values()) f.setError(null);
    let { value, problems } = collect();
    if (problems.length === 0) {
      problems = value === undefined ? [{ path: "$", message: "is required" }] : validate(effective, value);
    }
    if (problems.length) {
      let first = null;
      const unplaced = [];
      for (const p of problems) {
        const f = fields.get(p.path) || fields.get(p.path.replace(/(\.[^.[]+|\[[^\]]+\]).*$/, "$1"));
        if (f) {
          f.setError(p.message);
          first = first || f;
        } else {
          unplaced.push(p);
        }
      }
      if (unplaced.length) {
        const f = fields.values().next().value;
        f.setError(unplaced.map((p) => `${p.path}: ${p.message}`).join("; "));
        first = first || f;
      }
      first?.input.focus();
      return { ok: false, problems };
    }
    return { ok: true, value };
  };
  return { element, read };
}
