// The flow drawn as a graph: a small layered layout, and an SVG painted from a snapshot.
//
// Why hand-written: a flow is a DAG plus loop edges (validation guarantees every cycle passes a
// loop edge), and flows have tens of nodes, not thousands. The classic layered recipe (Sugiyama)
// is enough and fits in this file: ranks by longest path over the non-loop edges, a dummy point
// per rank that a long edge crosses, a few barycenter sweeps to cut crossings, then coordinates.
// Loop edges are left out of the ranking and drawn as arcs on the right-hand side.

import { s } from "./dom.js";

const NODE_W = 176;
const NODE_H = 50;
const DUMMY_W = 14;
const GAP_X = 36;
const GAP_Y = 44;
const MARGIN = 16;
const LOOP_LANE = 26;
const SWEEPS = 8;

export function edgeId(edge) {
  return edge.id ?? `${edge.from}->${edge.to}`;
}

/** Positions for every node and a path for every edge of a flow document. */
export function layoutFlow(flow) {
  const nodes = (flow.nodes || []).map((n, index) => ({ id: n.id, type: n.type, index }));
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const edges = (flow.edges || []).filter((e) => byId.has(e.from) && byId.has(e.to)).map((e) => ({
    id: edgeId(e), from: e.from, to: e.to, loop: e.maxIterations !== undefined && e.maxIterations !== null,
    maxIterations: e.maxIterations, forEach: e.forEach || null, when: e.when ?? null,
  }));
  const forward = edges.filter((e) => !e.loop && e.from !== e.to);

  // Ranks: the longest path from a source, over the edges that are not loops (Kahn's order).
  const rank = new Map(nodes.map((n) => [n.id, 0]));
  const indegree = new Map(nodes.map((n) => [n.id, 0]));
  const out = new Map(nodes.map((n) => [n.id, []]));
  for (const e of forward) {
    indegree.set(e.to, indegree.get(e.to) + 1);
    out.get(e.from).push(e.to);
  }
  const queue = nodes.filter((n) => indegree.get(n.id) === 0).map((n) => n.id);
  const placed = new Set();
  while (queue.length) {
    const id = queue.shift();
    placed.add(id);
    for (const next of out.get(id)) {
      rank.set(next, Math.max(rank.get(next), rank.get(id) + 1));
      indegree.set(next, indegree.get(next) - 1);
      if (indegree.get(next) === 0) queue.push(next);
    }
  }
  const deepest = Math.max(0, ...rank.values());
  for (const n of nodes) if (!placed.has(n.id)) rank.set(n.id, deepest + 1); // not a valid flow; still drawn

  // Layers, with a dummy item wherever a long edge crosses a rank.
  const depth = Math.max(0, ...rank.values()) + 1;
  const layers = Array.from({ length: depth }, () => []);
  const items = new Map();
  for (const n of nodes) {
    const item = { id: n.id, node: n, rank: rank.get(n.id), w: NODE_W, up: [], down: [], order: n.index };
    items.set(n.id, item);
    layers[item.rank].push(item);
  }
  const link = (a, b) => { a.down.push(b); b.up.push(a); };
  for (const e of forward) {
    const from = items.get(e.from);
    const to = items.get(e.to);
    const chain = [from];
    if (to.rank > from.rank) {
      for (let r = from.rank + 1; r < to.rank; r += 1) {
        const dummy = { id: `${e.id}#${r}`, node: null, rank: r, w: DUMMY_W, up: [], down: [], order: from.order };
        layers[r].push(dummy);
        chain.push(dummy);
      }
    }
    chain.push(to);
    for (let i = 1; i < chain.length; i += 1) link(chain[i - 1], chain[i]);
    e.chain = chain;
  }

  // Order within layers: barycenter sweeps, down then up.
  const position = () => layers.forEach((layer) => layer.forEach((item, i) => { item.pos = i; }));
  layers.forEach((layer) => layer.sort((a, b) => a.order - b.order));
  position();
  for (let sweep = 0; sweep < SWEEPS; sweep += 1) {
    const down = sweep % 2 === 0;
    const range = down ? layers.slice(1) : layers.slice(0, -1).reverse();
    for (const layer of range) {
      for (const item of layer) {
        const near = down ? item.up : item.down;
        item.bary = near.length ? near.reduce((sum, o) => sum + o.pos, 0) / near.length : item.pos;
      }
      layer.sort((a, b) => a.bary - b.bary || a.order - b.order);
      layer.forEach((item, i) => { item.pos = i; });
    }
  }

  // Coordinates: each layer centred on the widest.
  const layerWidth = (layer) => layer.reduce((sum, it) => sum + it.w, 0) + GAP_X * Math.max(0, layer.length - 1);
  const widest = Math.max(NODE_W, ...layers.map(layerWidth));
  layers.forEach((layer, r) => {
    let x = MARGIN + (widest - layerWidth(layer)) / 2;
    for (const item of layer) {
      item.x = x;
      item.y = MARGIN + r * (NODE_H + GAP_Y);
      x += item.w + GAP_X;
    }
  });

  // Forward edges: from the bottom of the source to the top of the target, spread when several
  // leave or enter one node, through the dummies.
  const spread = (list, id) => (list.indexOf(id) - (list.length - 1) / 2) * 14;
  const outs = new Map();
  const ins = new Map();
  for (const e of forward) {
    (outs.get(e.from) || outs.set(e.from, []).get(e.from)).push(e.id);
    (ins.get(e.to) || ins.set(e.to, []).get(e.to)).push(e.id);
  }
  for (const e of forward) {
    const [from, ...rest] = e.chain;
    const to = rest[rest.length - 1];
    const points = [[from.x + from.w / 2 + spread(outs.get(e.from), e.id), from.y + NODE_H]];
    for (const d of rest.slice(0, -1)) points.push([d.x + d.w / 2, d.y], [d.x + d.w / 2, d.y + NODE_H]);
    points.push([to.x + to.w / 2 + spread(ins.get(e.to), e.id), to.y]);
    if (to.rank <= from.rank) { // same rank (only in an invalid flow): a sideways curve
      points.splice(0, points.length, [from.x + from.w, from.y + NODE_H / 2], [to.x, to.y + NODE_H / 2]);
    }
    e.path = verticalPath(points);
    const [mx, my] = midpoint(points);
    e.labelAt = [mx + 6, my];
  }

  // Loop edges: arcs on the right, one lane each, beyond every node of the ranks they span.
  let width = MARGIN * 2 + widest;
  edges.filter((e) => e.loop || e.from === e.to).forEach((e, lane) => {
    const from = items.get(e.from);
    const to = items.get(e.to);
    if (from === to) {
      const x = from.x + from.w;
      const y = from.y;
      e.path = `M ${x} ${y + NODE_H * 0.3} C ${x + 48} ${y - 12}, ${x + 48} ${y + NODE_H + 12}, ${x} ${y + NODE_H * 0.7}`;
      e.labelAt = [x + 40, y + NODE_H / 2];
      width = Math.max(width, x + 110);
      return;
    }
    const low = Math.min(from.rank, to.rank);
    const high = Math.max(from.rank, to.rank);
    let right = 0;
    for (const layer of layers.slice(low, high + 1)) for (const it of layer) right = Math.max(right, it.x + it.w);
    const laneX = right + 30 + lane * LOOP_LANE;
    const p0 = [from.x + from.w, from.y + NODE_H / 2];
    const p3 = [to.x + to.w, to.y + NODE_H / 2];
    e.path = `M ${p0[0]} ${p0[1]} C ${laneX} ${p0[1]}, ${laneX} ${p3[1]}, ${p3[0]} ${p3[1]}`;
    e.labelAt = [(p0[0] + 3 * laneX + 3 * laneX + p3[0]) / 8 + 4, (p0[1] + p3[1]) / 2];
    width = Math.max(width, laneX + 80);
  });

  const height = MARGIN * 2 + depth * NODE_H + (depth - 1) * GAP_Y;
  const placedNodes = nodes.map((n) => ({ ...n, x: items.get(n.id).x, y: items.get(n.id).y, w: NODE_W, h: NODE_H }));
  return { nodes: placedNodes, edges, width, height };
}

function verticalPath(points) {
  let d = `M ${points[0][0]} ${points[0][1]}`;
  for (let i = 1; i < points.length; i += 1) {
    const [x0, y0] = points[i - 1];
    const [x1, y1] = points[i];
    if (x0 === x1) {
      d += ` L ${x1} ${y1}`;
    } else {
      const k = Math.max(12, (y1 - y0) / 2);
      d += ` C ${x0} ${y0 + k}, ${x1} ${y1 - k}, ${x1} ${y1}`;
    }
  }
  return d;
}

function midpoint(points) {
  const i = Math.floor((points.length - 1) / 2);
  const [x0, y0] = points[i];
  const [x1, y1] = points[i + 1] || points[i];
  return [(x0 + x1) / 2, (y0 + y1) / 2];
}

function clip(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

/**
 * The graph as SVG. paint(snapshot) colours it; onSelect(nodeId) is called when a node is clicked
 * or chosen with Enter/Space (every node is focusable).
 */
export class FlowGraph {
  constructor(flow, { onSelect }) {
    this.flow = flow;
    this.layout = layoutFlow(flow);
    this.onSelect = onSelect;
    this.nodes = new Map();
    this.edges = new Map();
    this.selected = null;
    const { width, height } = this.layout;
    this.element = s("svg", {
      class: "flow-graph", viewBox: `0 0 ${width} ${height}`, width, height, role: "group",
      "aria-label": `the flow ${flow.name} as a graph of ${this.layout.nodes.length} nodes`,
    });
    const defs = s("defs");
    for (const kind of ["pending", "fired", "skipped"]) {
      // In user space: the arrow keeps its size whatever the edge's stroke width.
      defs.append(s("marker", { id: `arrow-${kind}`, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 10,
        markerHeight: 10, markerUnits: "userSpaceOnUse", orient: "auto-start-reverse", class: `arrow arrow-${kind}` },
      s("path", { d: "M 0 0 L 10 5 L 0 10 z" })));
    }
    this.element.append(defs);
    const edgeLayer = s("g", { class: "edges" });
    for (const e of this.layout.edges) {
      const title = s("title", {}, this.edgeTitle(e, "pending"));
      const path = s("path", { class: "edge-line", d: e.path, "marker-end": "url(#arrow-pending)" });
      const label = s("text", { class: "edge-label", x: e.labelAt[0], y: e.labelAt[1] });
      const g = s("g", { class: `edge es-pending${e.loop ? " loop" : ""}`, "data-edge": e.id }, title, path, label);
      edgeLayer.append(g);
      this.edges.set(e.id, { edge: e, g, path, label, title });
    }
    const nodeLayer = s("g", { class: "nodes" });
    for (const n of this.layout.nodes) {
      const title = s("title", {}, n.id);
      const rect = s("rect", { width: n.w, height: n.h, rx: 8 });
      const name = s("text", { class: "node-id", x: 10, y: 21 }, clip(n.id, 19));
      const meta = s("text", { class: "node-meta", x: 10, y: 40 }, clip(n.type, 22));
      const badge = s("text", { class: "node-badge", x: n.w - 9, y: 21, "text-anchor": "end" });
      const g = s("g", {
        class: "node st-pending", transform: `translate(${n.x} ${n.y})`, tabindex: 0, role: "button",
        "data-node": n.id, "aria-label": `${n.id}: pending`,
      }, title, rect, name, meta, badge);
      g.addEventListener("click", () => this.select(n.id, true));
      g.addEventListener("keydown", (event) => {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          this.select(n.id, true);
        }
      });
      nodeLayer.append(g);
      this.nodes.set(n.id, { node: n, g, meta, badge, title });
    }
    this.element.append(edgeLayer, nodeLayer);
  }

  edgeTitle(e, status) {
    const parts = [`${e.id}: ${status}`];
    if (e.when !== null) parts.push(`when ${typeof e.when === "string" ? e.when : JSON.stringify(e.when)}`);
    if (e.forEach) parts.push(`for each ${e.forEach.as} in ${e.forEach.in}`);
    if (e.loop) parts.push(`loop edge, at most ${e.maxIterations} iterations`);
    return parts.join("; ");
  }

  select(nodeId, notify = false) {
    if (this.selected) this.nodes.get(this.selected)?.g.classList.remove("selected");
    this.selected = nodeId;
    const entry = nodeId ? this.nodes.get(nodeId) : null;
    if (entry) entry.g.classList.add("selected");
    if (notify && this.onSelect) this.onSelect(nodeId);
  }

  /** Colour nodes and edges by a RunSnapshot; show loop counters and forEach progress. */
  paint(snapshot) {
    const nodeStatus = snapshot.nodeStatus || {};
    const edgeStatus = snapshot.edgeStatus || {};
    for (const [id, { node, g, meta, badge, title }] of this.nodes) {
      const status = nodeStatus[id] || "pending";
      g.setAttribute("class", `node st-${status}${this.selected === id ? " selected" : ""}`);
      meta.textContent = clip(`${node.type} · ${status}`, 26);
      const progress = forEachProgress(snapshot, id, this.flow);
      const attempts = (snapshot.attempts || {})[id] || 0;
      let badgeText = "";
      if (progress) badgeText = `${progress.done}/${progress.total}`;
      else if (attempts > 1) badgeText = `try ${attempts}`;
      badge.textContent = badgeText;
      const fault = (snapshot.faults || {})[id];
      const details = [`${id} (${node.type}): ${status}`];
      if (progress) details.push(`forEach ${progress.done} of ${progress.total} done`);
      if (attempts > 1) details.push(`attempt ${attempts}`);
      if (fault) details.push(`${fault.errorType}: ${fault.message}`);
      title.textContent = details.join("; ");
      g.setAttribute("aria-label", details.join("; "));
    }
    for (const [id, { edge, g, path, label, title }] of this.edges) {
      const status = edgeStatus[id] || "pending";
      g.setAttribute("class", `edge es-${status}${edge.loop ? " loop" : ""}`);
      path.setAttribute("marker-end", `url(#arrow-${status})`);
      title.textContent = this.edgeTitle(edge, status);
      if (edge.loop) {
        label.textContent = `↻ ${(snapshot.loopCounters || {})[id] || 0}/${edge.maxIterations}`;
      } else if (edge.forEach) {
        label.textContent = `each ${edge.forEach.as}`;
      }
    }
  }
}

/** done/total of a forEach node, from the snapshot while it runs or from its output once done. */
export function forEachProgress(snapshot, nodeId, flow) {
  const state = (snapshot.forEach || {})[nodeId];
  if (state) {
    return { done: state.results.filter((r) => r !== null && r !== undefined).length, total: state.items.length };
  }
  const isTarget = (flow.edges || []).some((e) => e.forEach && e.to === nodeId);
  const output = (snapshot.outputs || {})[nodeId];
  if (isTarget && output && Array.isArray(output.iterations)) {
    return { done: output.iterations.length, total: output.iterations.length };
  }
  return null;
}
