// Agent text as people write it: Markdown, rendered by marked and cleaned by DOMPurify before it
// reaches the page. Run data is untrusted (a model can be talked into writing anything), so the HTML
// that comes out holds no script, no event handler, no form, no style, and loads nothing: HTML written
// in the text is shown as text (never parsed as markup, not even by the sanitiser), images become
// their alt text, links open in a new tab without access to this page, and only http(s), mailto and
// in-page links survive. The page's Content-Security-Policy forbids the rest again.

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.js";
import { h } from "./dom.js";

// Past this, text is shown as it is: parsing megabytes would freeze the page.
const MAX_MARKDOWN = 200_000;
const SAFE_URL = /^(?:https?:|mailto:|#)/i;

const marked = new Marked({
  gfm: true,
  breaks: true, // a model's single line breaks are meant as line breaks
  async: false,
  renderer: {
    // HTML in the text (a block or an inline tag) is text the agent wrote: shown, not parsed.
    html({ text }) {
      return escapeHtml(text);
    },
    // An image would be a request to wherever its address points: show what it is instead.
    image({ href, text }) {
      const label = text ? `[image: ${text}]` : "[image]";
      return escapeHtml(href ? `${label} (${href})` : label);
    },
  },
});

const purify = DOMPurify(window);
purify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    const href = node.getAttribute("href") || "";
    if (!SAFE_URL.test(href.trim())) node.removeAttribute("href");
    if (!href.startsWith("#")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer nofollow");
    }
  }
});

const CONFIG = {
  USE_PROFILES: { html: true }, // no SVG or MathML
  FORBID_TAGS: ["img", "picture", "source", "video", "audio", "track", "iframe", "frame", "object", "embed",
    "form", "input", "button", "select", "textarea", "option", "style", "link", "meta", "base", "dialog"],
  FORBID_ATTR: ["style", "src", "srcset", "action", "formaction", "background", "poster", "ping", "id", "name"],
  ALLOWED_URI_REGEXP: SAFE_URL,
  RETURN_DOM_FRAGMENT: true,
};

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

/** A block showing ``text`` rendered from Markdown (sanitised); ``className`` is added to it. */
export function markdown(text, { className = "" } = {}) {
  const value = typeof text === "string" ? text : JSON.stringify(text, null, 2) ?? "";
  const block = h("div", { class: `markdown ${className}`.trim() });
  if (value.length > MAX_MARKDOWN) {
    block.append(h("pre", { class: "value" }, value));
    return block;
  }
  block.append(purify.sanitize(marked.parse(value), CONFIG));
  return block;
}
