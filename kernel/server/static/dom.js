// Building DOM nodes. Text always goes in as text nodes (never as HTML): run data is untrusted.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(element, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      element.addEventListener(key.slice(2), value);
    } else if (key === "dataset") {
      Object.assign(element.dataset, value);
    } else if (value === true) {
      element.setAttribute(key, "");
    } else {
      element.setAttribute(key, String(value));
    }
  }
  append(element, children);
  return element;
}

/** Append children: nodes, strings (as text), numbers; arrays are flattened, null skipped. */
export function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

/** An HTML element: h("a", {href: "#/"}, "Runs"). */
export function h(tag, attrs = {}, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element, with the same calling convention as h(). */
export function s(tag, attrs = {}, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Replace every child of element. */
export function replaceChildren(element, ...children) {
  element.replaceChildren();
  return append(element, children);
}

let counter = 0;

/** A document-unique id for label/for and aria pairs. */
export function uid(prefix = "fk") {
  counter += 1;
  return `${prefix}-${counter}`;
}
