// The public HTTP API under /api/v1 (DESIGN §10): the only thing this UI talks to.

const BASE = "api/v1";
const TOKEN_KEY = "flowkernel.apiToken";

/** An error answered by the API as application/problem+json (or a network failure). */
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

let token = sessionStorage.getItem(TOKEN_KEY);
let askToken = null;
let asking = null;

/**
 * Register how to ask the user for the API token: fn(message) -> Promise<string>. Several requests
 * refused at once share one question.
 */
export function setTokenPrompt(fn) {
  askToken = fn;
}

async function newToken(hadToken) {
  if (!askToken) throw new ApiError(401, { title: "Unauthorized", detail: "this server needs a token" });
  if (!asking) {
    const message = hadToken ? "That token was refused. Enter the server's API token (FLOWKERNEL_API_TOKEN)."
      : "Enter the server's API token (FLOWKERNEL_API_TOKEN). It is kept for this browser session only.";
    asking = askToken(message).then((value) => {
      token = value;
      sessionStorage.setItem(TOKEN_KEY, value);
      return value;
    }).finally(() => { asking = null; });
  }
  return asking;
}

function url(path, query) {
  const u = new URL(`${BASE}${path}`, document.baseURI);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined && value !== "") u.searchParams.set(key, String(value));
  }
  return u;
}

function headers(extra = {}) {
  const out = { Accept: "application/json", ...extra };
  if (token) out.Authorization = `Bearer ${token}`;
  return out;
}

async function problemOf(response) {
  try {
    const body = await response.json();
    if (body && typeof body === "object") return body;
  } catch { /* not JSON: fall through */ }
  return { title: response.statusText || "Error", status: response.status, detail: `HTTP ${response.status}` };
}

/** fetch() with the token; a 401 asks for a token and tries again. */
async function send(path, { method = "GET", query = null, body = undefined, signal = null, accept = null } = {}) {
  for (;;) {
    const sentWith = token;
    const init = { method, signal, headers: headers(accept ? { Accept: accept } : {}) };
    // The server takes a request that changes state only as JSON (an empty one as {}): what a page
    // of another site cannot send without asking the server first.
    if (body !== undefined || (method !== "GET" && method !== "HEAD")) {
      init.body = JSON.stringify(body === undefined ? {} : body);
      init.headers["Content-Type"] = "application/json";
    }
    let response;
    try {
      response = await fetch(url(path, query), init);
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new ApiError(0, { title: "Network error", detail: `the server did not answer (${error.message})` });
    }
    if (response.status === 401) {
      if (token !== sentWith) continue; // someone entered a token meanwhile
      await newToken(Boolean(sentWith));
      continue;
    }
    if (!response.ok) throw new ApiError(response.status, await problemOf(response));
    return response;
  }
}

/** GET (or another method) a JSON resource. */
export async function api(path, options = {}) {
  const response = await send(path, options);
  return response.json();
}

/** POST a command or a new resource; the problem of a refusal is thrown as ApiError. */
export async function post(path, body = {}) {
  return api(path, { method: "POST", body });
}

/** Every item of a paginated list, following nextCursor. */
export async function allItems(path, query = {}, { signal = null, limit = 500 } = {}) {
  const items = [];
  let cursor = null;
  do {
    const page = await api(path, { query: { ...query, limit, cursor }, signal });
    items.push(...page.items);
    cursor = page.nextCursor;
  } while (cursor);
  return items;
}

/** Whether the page has a token (so the UI can offer to forget it). */
export function hasToken() {
  return Boolean(token);
}

export function forgetToken() {
  token = null;
  sessionStorage.removeItem(TOKEN_KEY);
}

/**
 * Follow a run's event stream (Server-Sent Events from the durable log). fetch() rather than
 * EventSource: EventSource cannot send the Authorization header. On a dropped connection it
 * reconnects after the last seq it saw, so no event is missed or repeated; it stops after
 * flow:complete, when the server says nothing more will come (204: a completed or aborted run with
 * no event after `after`), or when signal aborts.
 *
 * onEvent(event) gets each event; onState("open" | "reconnecting" | "closed" | "error", detail).
 */
export async function followStream(runId, { after = 0, signal, onEvent, onState = () => {} }) {
  let last = after;
  let delay = 500;
  while (!signal.aborted) {
    try {
      const response = await send(`/runs/${encodeURIComponent(runId)}/stream`,
        { query: { after: last }, signal, accept: "text/event-stream" });
      if (response.status === 204) {
        onState("closed");
        return;
      }
      onState("open");
      delay = 500;
      const ended = await readFrames(response.body, signal, (frame) => {
        if (frame.data === undefined) return false;
        const event = JSON.parse(frame.data);
        last = event.seq;
        onEvent(event);
        return event.type === "flow:complete";
      });
      if (ended) {
        onState("closed");
        return;
      }
    } catch (error) {
      if (signal.aborted || error.name === "AbortError") return;
      if (error instanceof ApiError && error.status >= 400 && error.status < 500) {
        onState("error", error);
        return;
      }
    }
    if (signal.aborted) return;
    onState("reconnecting");
    await sleep(delay, signal);
    delay = Math.min(delay * 2, 10_000);
  }
}

const FRAME_END = /\r?\n\r?\n/;

/** Parse text/event-stream frames; onFrame returns true to stop. Resolves true if stopped that way. */
async function readFrames(body, signal, onFrame) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  const stop = () => reader.cancel().catch(() => {});
  signal.addEventListener("abort", stop, { once: true });
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      buffer += value;
      let end;
      while ((end = FRAME_END.exec(buffer))) {
        const block = buffer.slice(0, end.index);
        buffer = buffer.slice(end.index + end[0].length);
        const frame = {};
        for (const line of block.split(/\r?\n/)) {
          if (line === "" || line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const name = colon < 0 ? line : line.slice(0, colon);
          let field = colon < 0 ? "" : line.slice(colon + 1);
          if (field.startsWith(" ")) field = field.slice(1);
          frame[name] = name === "data" && frame.data !== undefined ? `${frame.data}\n${field}` : field;
        }
        if (onFrame(frame)) {
          stop();
          return true;
        }
      }
    }
  } finally {
    signal.removeEventListener("abort", stop);
  }
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}
