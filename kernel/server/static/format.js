// How values read on screen: times, durations, money, tokens, JSON.

import { h } from "./dom.js";

const pad = (n, width = 2) => String(n).padStart(width, "0");

/** Unix ms -> "2025-01-31 14:05:09" in the browser's time zone. */
export function datetime(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** Unix ms -> "14:05:09.123". */
export function clock(ms) {
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** A span of milliseconds -> "850 ms", "12.3 s", "4 min 05 s", "2 h 03 min". */
export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  const s = Math.floor(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${pad(s % 60)} s`;
  const m = Math.floor(s / 60);
  if (m < 24 * 60) return `${Math.floor(m / 60)} h ${pad(m % 60)} min`;
  return `${Math.floor(m / 1440)} d ${pad(Math.floor((m % 1440) / 60))} h`;
}

/** Milliseconds since ms -> "3 min ago". */
export function ago(ms, now = Date.now()) {
  const diff = Math.max(0, now - ms);
  if (diff < 5000) return "just now";
  return `${duration(diff).replace(/\.\d+ s$/, " s")} ago`;
}

/** US dollars with enough digits to see a cheap model call: "$0.0042". */
export function cost(usd) {
  if (usd === null || usd === undefined) return "—";
  if (usd === 0) return "$0";
  if (usd < 0.01) return `$${usd.toFixed(4)}`;
  if (usd < 100) return `$${usd.toFixed(3)}`;
  return `$${usd.toFixed(2)}`;
}

export function tokens(n) {
  if (n === null || n === undefined) return "—";
  return n.toLocaleString("en-US");
}

/** A usage object -> "1,024 in · 96 out · 512 cache read · 0 cache write". */
export function usage(u) {
  if (!u) return "—";
  const parts = [`${tokens(u.inputTokens || 0)} in`, `${tokens(u.outputTokens || 0)} out`];
  if (u.cacheReadInputTokens) parts.push(`${tokens(u.cacheReadInputTokens)} cache read`);
  if (u.cacheCreationInputTokens) parts.push(`${tokens(u.cacheCreationInputTokens)} cache write`);
  return parts.join(" · ");
}

/** Any JSON value as indented text; strings as they are. */
export function pretty(value) {
  if (typeof value === "string") return value;
  if (value === undefined) return "";
  return JSON.stringify(value, null, 2);
}

/** A one-line preview of a value, cut at n characters. */
export function preview(value, n = 120) {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  if (text === undefined) return "";
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > n ? `${line.slice(0, n - 1)}…` : line;
}

const LONG = 4000;

/**
 * A value in a <pre>, cut at a few thousand characters with a button that shows all of it:
 * a tool output of a megabyte must not freeze the page until someone asks for it.
 */
export function valueBlock(value, { label = null, className = "" } = {}) {
  const text = pretty(value);
  const pre = h("pre", { class: `value ${className}`.trim() });
  if (label) pre.setAttribute("aria-label", label);
  if (text.length <= LONG) {
    pre.textContent = text;
    return pre;
  }
  pre.textContent = `${text.slice(0, LONG)}…`;
  const more = h("button", { type: "button", class: "link show-full" },
    `Show all ${text.length.toLocaleString("en-US")} characters`);
  more.addEventListener("click", () => {
    pre.textContent = text;
    more.remove();
  });
  return h("div", { class: "long-value" }, pre, more);
}
