// ssaexec explorer: draws the SSA graph data embedded in this page (ssaexec/graph/explorer.py
// says what it holds and how the layout was chosen). Plain DOM and <canvas>, no library,
// no network. Groups (a lane x a phase of the step) expand in place; only row heights and
// column widths are recomputed. Everything that reads the data goes through the tables
// built once in build(). `#selftest` in the URL runs selfTest() and writes its results into
// the selftest <pre> for the browser tests; `#expand=all|none&select=ID&search=TEXT` set
// the opening state (screenshots).
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("explorer-data").textContent);
  const T = D.trace;                       // null without a trace
  const N = D.ops.length;
  const SPAN = -1;
  // geometry, in world units (CSS pixels at zoom 1)
  const NODE_W = 150, NODE_H = 24, SLOT_W = 168, RANK_H = 36, HEAD = 28, PAD = 10;
  const COLLAPSED_W = 200, COLLAPSED_H = 64, COL_GAP = 48, ROW_GAP = 44, CELL_GAP = 16;
  const ROW_LABEL_W = 110;
  const LONG_EDGE = 24 * RANK_H;           // longer edges are drawn faint unless selected
  const CRIT = "#dc2626", SEL = "#111827", MATCH = "#f59e0b";

  const $ = (id) => document.getElementById(id);
  const canvas = $("graph"), ctx = canvas.getContext("2d");
  const tlCanvas = $("timeline"), tctx = tlCanvas.getContext("2d");
  const tooltip = $("tooltip");

  // ---------------------------------------------------------------- tables built once
  const kindOf = {};
  for (const k of D.kinds) kindOf[k.kind] = k;
  const laneCol = new Map(D.lanes.map((l, i) => [l.lane, i]));
  const groupOps = D.groups.map(() => []);
  const preds = [], succs = [];            // distinct producer / consumer op ids
  for (let i = 0; i < N; i++) { groupOps[D.ops[i].g].push(i); preds.push([]); succs.push([]); }
  const E = { src: [], dst: [], dummy: [], ref: [] };   // one entry per (var or dummy, reader)
  const pairSeen = new Set();
  function addEdge(a, b, dummy, ref) {
    E.src.push(a); E.dst.push(b); E.dummy.push(dummy); E.ref.push(ref);
    const key = a * N + b;
    if (!pairSeen.has(key)) { pairSeen.add(key); succs[a].push(b); preds[b].push(a); }
  }
  D.vars.forEach((v, vi) => { if (v[3] >= 0) for (const r of v[4]) addEdge(v[3], r, 0, vi); });
  D.dummies.forEach((d, di) => { if (d[2] >= 0) for (const r of d[3]) addEdge(d[2], r, 1, di); });
  const versionsOf = new Map();            // var name -> var row indices
  D.vars.forEach((v, vi) => {
    const name = D.names[v[0]][0];
    if (!versionsOf.has(name)) versionsOf.set(name, []);
    versionsOf.get(name).push(vi);
  });
  const varLabel = (vi) => D.names[D.vars[vi][0]][0] + "@v" + D.vars[vi][2];
  const placeName = (p) => p === SPAN ? "all places" : D.meta.places[p];
  const searchFields = D.ops.map((op) => {
    const f = [op.n, op.t, op.k];
    for (const [, vi] of op.i) f.push(D.names[D.vars[vi][0]][0]);
    for (const [, vi] of op.o) f.push(D.names[D.vars[vi][0]][0]);
    return f;
  });
  const shortLabel = D.ops.map((op) => op.k === "compute" ? op.t : op.n);

  // trace: durations, critical path, slices per op
  let durColor = null, critical = new Set(), critEdges = new Set(), slicesOf = null;
  let minDur = 0, maxDur = 0;
  if (T) {
    const pos = T.mean_us.filter((d) => d > 0);
    // reduce, not Math.min(...xs): a spread of a long array overflows the stack
    minDur = pos.length ? pos.reduce((a, b) => Math.min(a, b)) : 0;
    maxDur = pos.length ? pos.reduce((a, b) => Math.max(a, b)) : 0;
    durColor = T.mean_us.map((d) => d >= 0 ? heat(d) : "#e5e7eb");
    critical = new Set(T.critical);
    for (let k = 1; k < T.critical.length; k++) critEdges.add(T.critical[k - 1] * N + T.critical[k]);
    slicesOf = D.ops.map(() => []);
    T.events.forEach((e, k) => slicesOf[e[0]].push(k));
  }
  function heat(us) {
    // log scale from the fastest to the slowest handle: pale blue -> yellow -> red
    const lo = Math.log(Math.max(minDur, 1e-3)), hi = Math.log(Math.max(maxDur, 1e-3));
    const t = hi > lo ? Math.min(1, Math.max(0, (Math.log(Math.max(us, 1e-3)) - lo) / (hi - lo))) : 0.5;
    const stops = [[219, 234, 254], [254, 240, 138], [251, 146, 60], [220, 38, 38]];
    const x = t * (stops.length - 1), k = Math.min(stops.length - 2, Math.floor(x)), f = x - k;
    const c = stops[k].map((a, j) => Math.round(a + (stops[k + 1][j] - a) * f));
    return "rgb(" + c.join(",") + ")";
  }

  // ---------------------------------------------------------------- state
  const collapsed = D.groups.map(() => !!D.meta.collapsed);
  const view = { scale: 1, tx: 0, ty: 0 };
  let selected = -1, selectedVar = null, hoverOp = -1;
  let matches = [], matchSet = new Set(), matchPos = -1;
  let colorBy = T ? "duration" : "kind", showCritical = !!T;
  const L = { nodeX: new Float64Array(N), nodeY: new Float64Array(N), groupBox: [], rowY: [],
              rowH: [], width: 0, height: 0, edges: [], visibleCount: 0 };

  // ---------------------------------------------------------------- layout
  function groupSize(g) {
    const G = D.groups[g];
    if (collapsed[g]) return [COLLAPSED_W, COLLAPSED_H];
    return [G.slots * SLOT_W - (SLOT_W - NODE_W) + 2 * PAD,
            HEAD + (G.max_rank - G.min_rank + 1) * RANK_H - (RANK_H - NODE_H) + PAD];
  }
  function layout() {
    const nCols = D.lanes.length, nRows = D.rows.length;
    const cells = new Map();               // row*nCols+col -> group ids
    D.groups.forEach((G, g) => {
      const key = G.row * nCols + laneCol.get(G.lane);
      if (!cells.has(key)) cells.set(key, []);
      cells.get(key).push(g);
    });
    const colW = new Array(nCols).fill(0), rowH = new Array(nRows).fill(0);
    const sizes = D.groups.map((_, g) => groupSize(g));
    for (const [key, gs] of cells) {
      const r = Math.floor(key / nCols), c = key % nCols;
      let w = 0;
      for (const g of gs) {
        const G = D.groups[g], [gw, gh] = sizes[g];
        w += gw + (w ? CELL_GAP : 0);
        // an expanded group starts at its first rank, so the row's ranks line up
        const top = collapsed[g] ? 0 : G.min_rank * RANK_H;
        rowH[r] = Math.max(rowH[r], top + gh);
      }
      colW[c] = Math.max(colW[c], w);
    }
    const colX = [];
    let x = ROW_LABEL_W;
    for (let c = 0; c < nCols; c++) { colX.push(x); x += colW[c] + COL_GAP; }
    const rowY = [];
    let y = 0;
    for (let r = 0; r < nRows; r++) { rowY.push(y); y += rowH[r] + ROW_GAP; }
    L.width = x; L.height = y; L.rowY = rowY; L.rowH = rowH;
    L.groupBox = new Array(D.groups.length);
    for (const [key, gs] of cells) {
      const r = Math.floor(key / nCols), c = key % nCols;
      const total = gs.reduce((s, g) => s + sizes[g][0], 0) + CELL_GAP * (gs.length - 1);
      let gx = colX[c] + (colW[c] - total) / 2;
      for (const g of gs) {
        const G = D.groups[g], [gw, gh] = sizes[g];
        const gy = rowY[r] + (collapsed[g] ? 0 : G.min_rank * RANK_H);
        L.groupBox[g] = { x: gx, y: gy, w: gw, h: gh };
        if (!collapsed[g]) {
          const slotsW = G.slots * SLOT_W - (SLOT_W - NODE_W);
          for (const i of groupOps[g]) {
            const op = D.ops[i];
            L.nodeX[i] = gx + PAD + (gw - 2 * PAD - slotsW) / 2 + op.x * SLOT_W;
            L.nodeY[i] = rowY[r] + HEAD + op.r * RANK_H;
          }
        }
        gx += gw + CELL_GAP;
      }
    }
    L.visibleCount = 0;
    for (let i = 0; i < N; i++) if (!collapsed[D.ops[i].g]) L.visibleCount++;
    buildEdges();
  }
  function endpoint(i, out) {
    // where an edge leaves (out) or enters an op: its box, or its collapsed group's box
    const g = D.ops[i].g;
    if (!collapsed[g]) return [L.nodeX[i] + NODE_W / 2, L.nodeY[i] + (out ? NODE_H : 0), i];
    const b = L.groupBox[g];
    return [b.x + b.w / 2, b.y + (out ? b.h : 0), N + g];
  }
  function buildEdges() {
    // drawn edges: op to op when both are visible, else aggregated per pair of endpoints
    const seen = new Map();
    L.edges = [];
    for (let k = 0; k < E.src.length; k++) {
      const a = E.src[k], b = E.dst[k];
      const ea = endpoint(a, true), eb = endpoint(b, false);
      if (ea[2] === eb[2]) continue;
      const key = ea[2] * (N + D.groups.length) + eb[2];
      const have = seen.get(key);
      if (have !== undefined) {
        const e = L.edges[have];
        e.count++;
        if (!E.dummy[k]) e.dummy = false;
        continue;
      }
      seen.set(key, L.edges.length);
      L.edges.push({ x1: ea[0], y1: ea[1], x2: eb[0], y2: eb[1], a: ea[2], b: eb[2],
                     src: a, dst: b, dummy: !!E.dummy[k], count: 1 });
    }
  }

  // ---------------------------------------------------------------- drawing the graph
  let dpr = 1, needDraw = false;
  function resize() {
    dpr = window.devicePixelRatio || 1;
    for (const c of [canvas, tlCanvas]) {
      const r = c.getBoundingClientRect();
      c.width = Math.max(1, Math.round(r.width * dpr));
      c.height = Math.max(1, Math.round(r.height * dpr));
    }
    requestDraw();
  }
  function requestDraw() {
    if (needDraw) return;
    needDraw = true;
    requestAnimationFrame(() => { needDraw = false; draw(); drawTimeline(); });
  }
  function opFill(i) {
    if (colorBy === "duration" && durColor) return durColor[i];
    const k = kindOf[D.ops[i].k];
    return k ? k.color : "#eeeeee";
  }
  function isHot(i) { return i === selected || i === hoverOp; }
  function edgeSelected(e) {
    return selected >= 0 && (e.a === selected || e.b === selected);
  }
  function curve(c, e) {
    const dy = Math.max(20, Math.abs(e.y2 - e.y1) * 0.4);
    c.moveTo(e.x1, e.y1);
    c.bezierCurveTo(e.x1, e.y1 + dy, e.x2, e.y2 - dy, e.x2, e.y2);
  }
  const labelCache = new Map();
  function fitText(c, text, width) {
    const key = text + "|" + width;
    let t = labelCache.get(key);
    if (t !== undefined) return t;
    t = text;
    if (c.measureText(t).width > width) {
      let lo = 0, hi = text.length;
      while (lo < hi) {
        const mid = (lo + hi + 1) >> 1;
        if (c.measureText(text.slice(0, mid) + "…").width <= width) lo = mid; else hi = mid - 1;
      }
      t = text.slice(0, lo) + "…";
    }
    labelCache.set(key, t);
    return t;
  }
  let drawnNodes = 0;
  function draw() {
    const W = canvas.width / dpr, H = canvas.height / dpr;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, W, H);
    ctx.setTransform(dpr * view.scale, 0, 0, dpr * view.scale, dpr * view.tx, dpr * view.ty);
    const x0 = -view.tx / view.scale, y0 = -view.ty / view.scale;
    const x1 = x0 + W / view.scale, y1 = y0 + H / view.scale;
    const inView = (x, y, w, h) => x + w >= x0 && x <= x1 && y + h >= y0 && y <= y1;
    const s = view.scale, lw = 1 / s;
    // row labels
    ctx.fillStyle = "#9ca3af";
    ctx.font = "bold 14px system-ui, sans-serif";
    ctx.textBaseline = "top";
    D.rows.forEach((name, r) => ctx.fillText(name, 8, L.rowY[r] + 6));
    // group boxes
    ctx.font = "12px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    const matchCount = new Array(D.groups.length).fill(0);
    for (const i of matches) matchCount[D.ops[i].g]++;
    D.groups.forEach((G, g) => {
      const b = L.groupBox[g];
      if (!inView(b.x, b.y, b.w, b.h)) return;
      const hasSel = selected >= 0 && D.ops[selected].g === g;
      if (collapsed[g]) {
        ctx.fillStyle = G.lane === SPAN ? "#fee2e2" : "#eef2ff";
        ctx.strokeStyle = hasSel ? SEL : (matchCount[g] ? MATCH : "#6b7280");
        ctx.lineWidth = (hasSel || matchCount[g] ? 3 : 1) * lw;
        ctx.beginPath(); ctx.roundRect(b.x, b.y, b.w, b.h, 6); ctx.fill(); ctx.stroke();
        ctx.fillStyle = "#111827";
        ctx.fillText(fitText(ctx, "▸ " + G.label, b.w - 16), b.x + 8, b.y + 16);
        ctx.fillStyle = "#4b5563";
        let info = G.n + " handle" + (G.n === 1 ? "" : "s");
        if (matchCount[g]) info += " · " + matchCount[g] + " match";
        if (T) {
          let tot = 0, crit = 0;
          for (const i of groupOps[g]) { if (T.mean_us[i] > 0) tot += T.mean_us[i]; if (critical.has(i)) crit++; }
          info += " · " + fmtUs(tot);
          if (crit && showCritical) info += " · " + crit + " critical";
        }
        ctx.fillText(fitText(ctx, info, b.w - 16), b.x + 8, b.y + 40);
      } else {
        ctx.fillStyle = G.lane === SPAN ? "rgba(254,226,226,0.35)" : "rgba(238,242,255,0.5)";
        ctx.strokeStyle = "#9ca3af";
        ctx.lineWidth = lw;
        ctx.beginPath(); ctx.roundRect(b.x, b.y, b.w, b.h, 6); ctx.fill(); ctx.stroke();
        ctx.fillStyle = "#374151";
        ctx.fillText(fitText(ctx, "▾ " + G.label + " (" + G.n + ")", b.w - 16), b.x + 8, b.y + 13);
      }
    });
    // edges: plain, dummy (dashed), faint long ones, then highlighted ones on top
    const plain = new Path2D(), dashed = new Path2D(), faint = new Path2D();
    const hot = [], crit = [];
    for (const e of L.edges) {
      const ex = Math.min(e.x1, e.x2), ey = Math.min(e.y1, e.y2);
      if (!inView(ex, ey, Math.abs(e.x2 - e.x1), Math.abs(e.y2 - e.y1))) continue;
      if (edgeSelected(e)) { hot.push(e); continue; }
      if (showCritical && e.a < N && e.b < N && critEdges.has(e.a * N + e.b)) { crit.push(e); continue; }
      // long edges, and edges between a handle and a collapsed group, stay in the background
      if ((e.a < N) !== (e.b < N) || (Math.abs(e.y2 - e.y1) > LONG_EDGE && e.a < N && e.b < N)) curve(faint, e);
      else curve(e.dummy ? dashed : plain, e);
    }
    ctx.lineWidth = lw;
    ctx.strokeStyle = "rgba(75,85,99,0.12)"; ctx.stroke(faint);
    ctx.strokeStyle = "#6b7280"; ctx.stroke(plain);
    ctx.setLineDash([4 * lw, 3 * lw]); ctx.strokeStyle = "#a8a29e"; ctx.stroke(dashed);
    ctx.setLineDash([]);
    for (const [list, color, w] of [[crit, CRIT, 2.5], [hot, "#1d4ed8", 2]]) {
      if (!list.length) continue;
      const solid = new Path2D(), dash = new Path2D();
      for (const e of list) curve(e.dummy ? dash : solid, e);
      ctx.strokeStyle = color; ctx.lineWidth = Math.max(w * lw, w * 0.5);
      ctx.stroke(solid);
      ctx.setLineDash([5 * lw, 3 * lw]); ctx.stroke(dash); ctx.setLineDash([]);
    }
    // nodes
    const labels = s * NODE_H >= 9;
    ctx.font = "11px system-ui, sans-serif";
    drawnNodes = 0;
    for (let g = 0; g < D.groups.length; g++) {
      if (collapsed[g]) continue;
      const b = L.groupBox[g];
      if (!inView(b.x, b.y, b.w, b.h)) continue;
      for (const i of groupOps[g]) {
        const x = L.nodeX[i], y = L.nodeY[i];
        if (!inView(x, y, NODE_W, NODE_H)) continue;
        drawnNodes++;
        ctx.fillStyle = opFill(i);
        ctx.fillRect(x, y, NODE_W, NODE_H);
        let stroke = "#374151", width = 1;
        if (matchSet.has(i)) { stroke = MATCH; width = 3; }
        if (showCritical && critical.has(i)) { stroke = CRIT; width = 3; }
        if (isHot(i)) { stroke = SEL; width = 3; }
        ctx.strokeStyle = stroke;
        ctx.lineWidth = Math.max(width * lw, width * 0.4);
        ctx.strokeRect(x, y, NODE_W, NODE_H);
        if (i === selected) {
          ctx.strokeStyle = "#60a5fa"; ctx.lineWidth = 2 * lw;
          ctx.strokeRect(x - 4 * lw, y - 4 * lw, NODE_W + 8 * lw, NODE_H + 8 * lw);
        }
        if (labels) {
          ctx.fillStyle = "#111827";
          ctx.fillText(fitText(ctx, shortLabel[i], NODE_W - 8), x + 4, y + NODE_H / 2);
        }
      }
    }
  }

  // ---------------------------------------------------------------- view control
  function fit() {
    const W = canvas.width / dpr, H = canvas.height / dpr;
    const s = Math.min(W / L.width, H / L.height) * 0.96;
    view.scale = Math.min(Math.max(s, 0.02), 2);
    view.tx = (W - L.width * view.scale) / 2;
    view.ty = Math.max(8, (H - L.height * view.scale) / 2);
    requestDraw();
  }
  function centerOn(x, y, minScale) {
    const W = canvas.width / dpr, H = canvas.height / dpr;
    if (minScale && view.scale < minScale) view.scale = minScale;
    view.tx = W / 2 - x * view.scale;
    view.ty = H / 2 - y * view.scale;
    requestDraw();
  }
  function toWorld(cx, cy) {
    const r = canvas.getBoundingClientRect();
    return [(cx - r.left - view.tx) / view.scale, (cy - r.top - view.ty) / view.scale];
  }
  function hit(wx, wy) {
    // an op box, else a group (collapsed box or expanded header)
    for (let g = 0; g < D.groups.length; g++) {
      const b = L.groupBox[g];
      if (wx < b.x || wx > b.x + b.w || wy < b.y || wy > b.y + b.h) continue;
      if (collapsed[g]) return { group: g };
      for (const i of groupOps[g]) {
        const x = L.nodeX[i], y = L.nodeY[i];
        if (wx >= x && wx <= x + NODE_W && wy >= y && wy <= y + NODE_H) return { op: i };
      }
      if (wy <= b.y + HEAD - 4) return { group: g, header: true };
    }
    return null;
  }
  function setCollapsed(g, value) {
    if (collapsed[g] === value) return;
    // keep the group's top-left corner where it is on screen
    const before = L.groupBox[g];
    const sx = before.x * view.scale + view.tx, sy = before.y * view.scale + view.ty;
    collapsed[g] = value;
    layout();
    const after = L.groupBox[g];
    view.tx = sx - after.x * view.scale;
    view.ty = sy - after.y * view.scale;
    requestDraw();
  }
  function setAll(value) {
    collapsed.fill(value);
    layout();
    fit();
  }
  function reveal(i, minScale) {
    const g = D.ops[i].g;
    if (collapsed[g]) { collapsed[g] = false; layout(); }
    centerOn(L.nodeX[i] + NODE_W / 2, L.nodeY[i] + NODE_H / 2, minScale === undefined ? 0.8 : minScale);
  }

  let drag = null;
  canvas.addEventListener("mousedown", (ev) => {
    drag = { x: ev.clientX, y: ev.clientY, tx: view.tx, ty: view.ty, moved: false };
    canvas.classList.add("panning");
  });
  window.addEventListener("mousemove", (ev) => {
    if (drag) {
      const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
      view.tx = drag.tx + dx; view.ty = drag.ty + dy;
      requestDraw();
      return;
    }
    if (ev.target === canvas) {
      const h = hit(...toWorld(ev.clientX, ev.clientY));
      const i = h && h.op !== undefined ? h.op : -1;
      if (i !== hoverOp) { hoverOp = i; requestDraw(); }
      if (h) showTip(ev, h.op !== undefined ? opTip(h.op) :
        D.groups[h.group].label + " · " + D.groups[h.group].n + " handles · click to " +
        (collapsed[h.group] ? "expand" : "collapse"));
      else hideTip();
    }
  });
  window.addEventListener("mouseup", () => { canvas.classList.remove("panning"); setTimeout(() => { drag = null; }, 0); });
  canvas.addEventListener("click", (ev) => {
    if (drag && drag.moved) return;
    const h = hit(...toWorld(ev.clientX, ev.clientY));
    if (!h) return;
    if (h.op !== undefined) selectOp(h.op, "graph");
    else setCollapsed(h.group, !collapsed[h.group]);
  });
  canvas.addEventListener("mouseleave", () => { hideTip(); if (hoverOp >= 0) { hoverOp = -1; requestDraw(); } });
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = canvas.getBoundingClientRect();
    const mx = ev.clientX - r.left, my = ev.clientY - r.top;
    const f = Math.exp(-ev.deltaY * (ev.deltaMode ? 0.05 : 0.0015));
    const s = Math.min(4, Math.max(0.01, view.scale * f));
    view.tx = mx - (mx - view.tx) * (s / view.scale);
    view.ty = my - (my - view.ty) * (s / view.scale);
    view.scale = s;
    requestDraw();
  }, { passive: false });

  function showTip(ev, text) {
    tooltip.textContent = text;
    tooltip.hidden = false;
    tooltip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 300) + "px";
    tooltip.style.top = (ev.clientY + 14) + "px";
  }
  function hideTip() { tooltip.hidden = true; }
  function opTip(i) {
    const op = D.ops[i];
    let t = "#" + i + " " + op.n + " · " + op.k + " · " + op.st + " stream";
    if (T && T.mean_us[i] >= 0) t += " · " + fmtUs(T.mean_us[i]);
    return t;
  }
  function fmtUs(us) {
    if (us >= 1e6) return (us / 1e6).toFixed(2) + " s";
    if (us >= 1e3) return (us / 1e3).toFixed(2) + " ms";
    return us.toFixed(1) + " µs";
  }

  // ---------------------------------------------------------------- details panel
  function el(tag, props, ...kids) {
    const e = document.createElement(tag);
    if (props) for (const k in props) {
      if (k === "text") e.textContent = props[k];
      else if (k === "cls") e.className = props[k];
      else e.setAttribute(k, props[k]);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  const opLink = (i, text) => el("span", { cls: "link", "data-op": i, text: text || ("#" + i + " " + D.ops[i].n) });
  const varLink = (name, text) => el("span", { cls: "link", "data-var": name, text: text || name });
  function row(k, ...v) { return el("tr", null, el("td", { cls: "k", text: k }), el("td", null, ...v)); }
  function shapeText(nameIdx) {
    const [, shape, dtype, flags] = D.names[nameIdx];
    let t = (shape ? "[" + shape.join(", ") + "]" : "?") + " " + (dtype || "");
    if (flags.includes("P")) t += " param"; else if (flags.includes("S")) t += " persistable";
    if (flags.includes("D")) t += " data";
    return t;
  }
  function varTable(list, isInput) {
    // one row per var: the slot, then the version (a link to the var), its place, shape
    // and dtype, and who wrote it (inputs) or reads it (outputs)
    const t = el("table");
    for (const [slot, vi] of list) {
      const v = D.vars[vi], name = D.names[v[0]][0];
      const who = el("span", { cls: "muted", text: isInput ? " · written by " : " · read by " });
      if (isInput) who.append(v[3] >= 0 ? opLink(v[3], "#" + v[3] + " " + shortLabel[v[3]]) : "nobody (before the run)");
      else {
        v[4].forEach((r, k) => { if (k) who.append(", "); who.append(opLink(r, "#" + r + " " + shortLabel[r])); });
        if (!v[4].length) who.append("nobody");
      }
      t.append(el("tr", null, el("td", { cls: "k", text: slot || "·" }),
        el("td", null, el("div", null, varLink(name, name + "@v" + v[2])),
          el("div", { cls: "muted", text: placeName(v[1]) + " · " + shapeText(v[0]) }, who))));
    }
    return t;
  }
  function opList(ids) {
    const ul = el("ul");
    for (const i of ids) ul.append(el("li", null, opLink(i)));
    if (!ids.length) ul.append(el("li", { cls: "muted", text: "none" }));
    return ul;
  }
  function showOp(i) {
    const op = D.ops[i], k = kindOf[op.k];
    const box = $("details");
    box.replaceChildren();
    box.append(el("h2", { id: "details-title", text: op.n }));
    box.append(el("div", null,
      el("span", { cls: "badge", style: "background:" + (k ? k.color : "#eee"), text: k ? k.legend : op.k }),
      el("span", { cls: "badge", text: op.st + " stream" }),
      el("span", { cls: "badge", text: op.s }),
      showCritical && critical.has(i) ? el("span", { cls: "badge", style: "border-color:" + CRIT + ";color:" + CRIT, text: "critical path" }) : null));
    const info = el("table");
    info.append(row("handle", "#" + i + " (" + op.k + ")"));
    info.append(row("op type", op.t));
    info.append(row("place", placeName(op.p)));
    info.append(row("group", D.groups[op.g].label));
    info.append(row("level", String(op.lv)));
    for (const key in op.d) info.append(row(key, typeof op.d[key] === "string" ? op.d[key] : JSON.stringify(op.d[key])));
    if (T) {
      const sl = slicesOf[i];
      info.append(row("mean time", T.mean_us[i] >= 0 ? fmtUs(T.mean_us[i]) + " over " + sl.length + " slice" + (sl.length === 1 ? "" : "s") : "not run"));
      if (sl.length) info.append(row("per step", sl.map((k) => "step " + T.events[k][1] + ": " + fmtUs(T.events[k][3])).join(", ")));
    }
    box.append(info);
    if (op.a && Object.keys(op.a).length) {
      box.append(el("h3", { text: "attributes" }));
      const at = el("table");
      for (const key of Object.keys(op.a).sort()) at.append(row(key, op.a[key]));
      box.append(at);
    }
    box.append(el("h3", { text: "inputs (" + op.i.length + ")" }), varTable(op.i, true));
    box.append(el("h3", { text: "outputs (" + op.o.length + ")" }), varTable(op.o, false));
    if (op.di.length || op.do.length) {
      box.append(el("h3", { text: "dummy edges (" + (op.di.length + op.do.length) + ")" }));
      const ul = el("ul");
      for (const di of op.di) {
        const d = D.dummies[di];
        ul.append(el("li", null, "after ", opLink(d[2]), " ", el("span", { cls: "reason", text: d[1] }), " ", el("span", { cls: "muted", text: d[0] })));
      }
      for (const di of op.do) {
        const d = D.dummies[di];
        for (const r of d[3]) ul.append(el("li", null, "before ", opLink(r), " ", el("span", { cls: "reason", text: d[1] }), " ", el("span", { cls: "muted", text: d[0] })));
      }
      box.append(ul);
    }
    box.append(el("h3", { text: "predecessors (" + preds[i].length + ")" }), opList(preds[i]));
    box.append(el("h3", { text: "successors (" + succs[i].length + ")" }), opList(succs[i]));
  }
  function showVar(name) {
    const box = $("details");
    box.replaceChildren();
    const rows = versionsOf.get(name) || [];
    box.append(el("h2", { id: "details-title", text: name }));
    if (!rows.length) { box.append(el("div", { cls: "muted", text: "no such var in the graph" })); return; }
    box.append(el("div", { cls: "muted", text: shapeText(D.vars[rows[0]][0]) + " · " + rows.length + " version(s) over " + new Set(rows.map((v) => D.vars[v][1])).size + " place(s)" }));
    const t = el("table");
    t.append(el("tr", null, el("td", { cls: "k", text: "place" }), el("td", { cls: "k", text: "version" }),
      el("td", { cls: "k", text: "written by" }), el("td", { cls: "k", text: "read by" })));
    const sorted = rows.slice().sort((a, b) => D.vars[a][1] - D.vars[b][1] || D.vars[a][2] - D.vars[b][2]);
    for (const vi of sorted) {
      const v = D.vars[vi];
      const readers = el("span");
      v[4].forEach((r, k) => { if (k) readers.append(", "); readers.append(opLink(r, "#" + r + " " + shortLabel[r])); });
      if (!v[4].length) readers.append(el("span", { cls: "muted", text: "nobody" }));
      t.append(el("tr", { "data-var-row": vi }, el("td", { text: placeName(v[1]) }), el("td", { text: "v" + v[2] }),
        el("td", null, v[3] >= 0 ? opLink(v[3], "#" + v[3] + " " + shortLabel[v[3]]) : el("span", { cls: "muted", text: "before the run" })),
        el("td", null, readers)));
    }
    box.append(t);
  }
  function showSummary() {
    const box = $("details");
    box.replaceChildren();
    box.append(el("h2", { id: "details-title", text: D.meta.title }));
    const t = el("table");
    t.append(row("op handles", String(D.meta.ops)));
    t.append(row("var versions", String(D.meta.vars)));
    t.append(row("dummy vars", String(D.meta.dummies)));
    t.append(row("collectives", String(D.meta.collectives)));
    t.append(row("places", D.meta.places.join(", ")));
    t.append(row("groups", D.groups.length + " (click a box to expand or collapse it)"));
    box.append(t);
    const kinds = el("table");
    for (const k of D.kinds) kinds.append(row(k.legend, String(k.count) + " · " + k.stream + " stream"));
    box.append(el("h3", { text: "handle kinds" }), kinds);
    if (T) {
      const tt = el("table");
      tt.append(row("slices", String(T.events.length)));
      if (T.steps.length) tt.append(row("steps", T.steps.map((s) => fmtUs(s[2])).join(", ")));
      tt.append(row("critical path", fmtUs(T.critical_us) + " over " + T.critical.length + " handles"));
      box.append(el("h3", { text: "trace" }), tt);
      const slow = [...Array(N).keys()].filter((i) => T.mean_us[i] > 0).sort((a, b) => T.mean_us[b] - T.mean_us[a]).slice(0, 12);
      const ul = el("ul");
      for (const i of slow) ul.append(el("li", null, opLink(i), " ", el("span", { cls: "muted", text: fmtUs(T.mean_us[i]) })));
      box.append(el("h3", { text: "slowest handles" }), ul);
      const cl = el("ul");
      for (const i of T.critical) cl.append(el("li", null, opLink(i), " ", el("span", { cls: "muted", text: fmtUs(Math.max(T.mean_us[i], 0)) })));
      box.append(el("h3", { text: "critical path" }), cl);
    }
    box.append(el("h3", { text: "keys" }), el("div", { cls: "muted", text: "/ search · Enter next match · F fit · Esc clear · wheel zoom · drag pan" }));
  }
  $("details").addEventListener("click", (ev) => {
    const t = ev.target.closest(".link");
    if (!t) return;
    if (t.dataset.op !== undefined) selectOp(+t.dataset.op, "details");
    else if (t.dataset.var !== undefined) selectVar(t.dataset.var);
  });
  function selectOp(i, from) {
    selected = i; selectedVar = null;
    showOp(i);
    if (from !== "graph") reveal(i);
    if (from !== "timeline") scrollTimelineTo(i);
    requestDraw();
  }
  function selectVar(name) {
    selectedVar = name; selected = -1;
    showVar(name);
    // highlight the var's writers and readers
    const ids = new Set();
    for (const vi of versionsOf.get(name) || []) {
      const v = D.vars[vi];
      if (v[3] >= 0) ids.add(v[3]);
      for (const r of v[4]) ids.add(r);
    }
    setMatches([...ids].sort((a, b) => a - b), false);
    requestDraw();
  }
  function clearSelection() { selected = -1; selectedVar = null; showSummary(); requestDraw(); }

  // ---------------------------------------------------------------- search
  function compile(q, asRegex) {
    if (!q) return null;
    let m = /^\/(.*)\/([imsu]*)$/.exec(q);
    if (asRegex || m) {
      try { return m ? new RegExp(m[1], m[2]) : new RegExp(q, "i"); } catch (e) { return undefined; }
    }
    const low = q.toLowerCase();
    return { test: (s) => s.toLowerCase().includes(low) };
  }
  function setMatches(list, jump) {
    matches = list; matchSet = new Set(list); matchPos = -1;
    $("match-count").textContent = list.length ? list.length + " handle" + (list.length === 1 ? "" : "s") : "";
    if (jump && list.length) nextMatch(1);
    requestDraw();
  }
  function search(q, asRegex) {
    const rx = compile(q, asRegex);
    $("search").classList.toggle("bad", rx === undefined);
    if (!rx) { setMatches([], false); return { ops: [], vars: [] }; }
    const ops = [];
    for (let i = 0; i < N; i++) if (searchFields[i].some((f) => rx.test(f))) ops.push(i);
    const vars = [...versionsOf.keys()].filter((n) => rx.test(n));
    setMatches(ops, false);
    showResults(q, ops, vars);
    return { ops, vars };
  }
  function showResults(q, ops, vars) {
    const box = $("details");
    box.replaceChildren();
    box.append(el("h2", { id: "details-title", text: "search: " + q }));
    box.append(el("div", { cls: "muted", id: "search-summary", text: ops.length + " op handle(s), " + vars.length + " var(s)" }));
    if (vars.length) {
      const ul = el("ul");
      for (const n of vars.slice(0, 60)) ul.append(el("li", null, varLink(n), " ", el("span", { cls: "muted", text: (versionsOf.get(n) || []).length + " versions" })));
      if (vars.length > 60) ul.append(el("li", { cls: "muted", text: "... " + (vars.length - 60) + " more" }));
      box.append(el("h3", { text: "vars" }), ul);
    }
    if (ops.length) {
      const ul = el("ul");
      for (const i of ops.slice(0, 200)) ul.append(el("li", null, opLink(i)));
      if (ops.length > 200) ul.append(el("li", { cls: "muted", text: "... " + (ops.length - 200) + " more" }));
      box.append(el("h3", { text: "op handles" }), ul);
    }
  }
  function nextMatch(step) {
    if (!matches.length) return -1;
    matchPos = (matchPos + step + matches.length) % matches.length;
    const i = matches[matchPos];
    selected = i;
    reveal(i);
    $("match-count").textContent = (matchPos + 1) + " / " + matches.length;
    if (selectedVar === null) showOp(i);
    scrollTimelineTo(i);
    requestDraw();
    return i;
  }
  let searchTimer = 0;
  $("search").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(() => { selectedVar = null; search($("search").value.trim(), $("regex").checked); }, 150);
  });
  $("search").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") { ev.preventDefault(); clearTimeout(searchTimer);
      if (!matches.length) search($("search").value.trim(), $("regex").checked);
      nextMatch(ev.shiftKey ? -1 : 1); }
    if (ev.key === "Escape") { $("search").value = ""; setMatches([], false); clearSelection(); $("search").blur(); }
  });
  $("regex").addEventListener("change", () => search($("search").value.trim(), $("regex").checked));
  $("next").addEventListener("click", () => nextMatch(1));
  $("prev").addEventListener("click", () => nextMatch(-1));
  $("fit").addEventListener("click", fit);
  $("expand-all").addEventListener("click", () => setAll(false));
  $("collapse-all").addEventListener("click", () => setAll(true));
  window.addEventListener("keydown", (ev) => {
    if (ev.target.tagName === "INPUT" || ev.target.tagName === "SELECT") return;
    if (ev.key === "/") { ev.preventDefault(); $("search").focus(); }
    else if (ev.key === "f" || ev.key === "F") fit();
    else if (ev.key === "Escape") { setMatches([], false); clearSelection(); }
  });

  // ---------------------------------------------------------------- timeline
  // lanes (a place and a stream) hold rows: slices that overlap in time (ops of one place run
  // by several threads) go to separate rows, as Perfetto's thread tracks keep them apart
  const TL = { lanes: [], row: null, rows: 0, t0: 0, t1: 1, scale: 1, offset: 0, laneH: 18, top: 18, left: 120 };
  function buildTimeline() {
    if (!T) return;
    $("timeline-pane").hidden = false;
    const streams = ["compute", "comm", "fetch"];
    const keyOf = (op) => op.p + "|" + op.st;
    const used = new Set(T.events.map((e) => keyOf(D.ops[e[0]])));
    const places = D.meta.places.map((_, p) => p).concat([SPAN]);
    const laneIdx = new Map();
    for (const p of places) {
      const st = streams.concat([...new Set(D.ops.filter((o) => o.p === p).map((o) => o.st))].filter((s) => !streams.includes(s)));
      for (const s of st) {
        const key = p + "|" + s;
        if (!used.has(key)) continue;
        laneIdx.set(key, TL.lanes.length);
        TL.lanes.push({ label: placeName(p) + " · " + s, events: [] });
      }
    }
    T.events.forEach((e, k) => TL.lanes[laneIdx.get(keyOf(D.ops[e[0]]))].events.push(k));
    TL.row = new Int32Array(T.events.length);
    for (const lane of TL.lanes) {
      lane.first = TL.rows;
      const ends = [];
      lane.events.sort((a, b) => T.events[a][2] - T.events[b][2]);
      for (const k of lane.events) {
        const e = T.events[k];
        let r = ends.findIndex((end) => end <= e[2]);
        if (r < 0) { r = ends.length; ends.push(0); }
        ends[r] = e[2] + e[3];
        TL.row[k] = lane.first + r;
      }
      lane.rows = Math.max(1, ends.length);
      TL.rows += lane.rows;
    }
    TL.t0 = T.events.reduce((a, e) => Math.min(a, e[2]), Infinity);
    TL.t1 = T.events.reduce((a, e) => Math.max(a, e[2] + e[3]), -Infinity);
    for (const s of T.steps) { TL.t0 = Math.min(TL.t0, s[1]); TL.t1 = Math.max(TL.t1, s[1] + s[2]); }
    $("timeline-title").textContent = "timeline: " + T.events.length + " slices" +
      (T.steps.length ? " in " + T.steps.length + " step(s)" : "") + " · critical path " + fmtUs(T.critical_us);
    const pane = $("timeline-pane");
    pane.style.height = Math.min(340, Math.max(120, TL.top + TL.rows * TL.laneH + 40)) + "px";
    tlFit();
  }
  function tlWidth() { return tlCanvas.width / dpr - TL.left - 8; }
  function tlFit() { TL.scale = tlWidth() / Math.max(TL.t1 - TL.t0, 1e-3); TL.offset = TL.t0; }
  const tlX = (t) => TL.left + (t - TL.offset) * TL.scale;
  function drawTimeline() {
    if (!T) return;
    const W = tlCanvas.width / dpr, H = tlCanvas.height / dpr;
    const c = tctx;
    c.setTransform(dpr, 0, 0, dpr, 0, 0);
    c.clearRect(0, 0, W, H);
    c.font = "10px system-ui, sans-serif";
    c.textBaseline = "middle";
    // steps
    T.steps.forEach((s, k) => {
      const x = tlX(s[1]), w = s[2] * TL.scale;
      c.fillStyle = k % 2 ? "#f8fafc" : "#f1f5f9";
      c.fillRect(Math.max(TL.left, x), 0, Math.min(W, x + w) - Math.max(TL.left, x), H);
      c.fillStyle = "#64748b";
      if (x + 4 > TL.left) c.fillText("step " + s[0] + " · " + fmtUs(s[2]), x + 4, 8);
    });
    const selSlices = [];
    c.save();
    c.beginPath(); c.rect(TL.left, 0, W - TL.left, H); c.clip();
    TL.lanes.forEach((lane) => {
      const bottom = TL.top + (lane.first + lane.rows) * TL.laneH;
      c.strokeStyle = "#e5e7eb"; c.lineWidth = 1;
      c.beginPath(); c.moveTo(TL.left, bottom); c.lineTo(W, bottom); c.stroke();
      for (const k of lane.events) {
        const e = T.events[k], y = TL.top + TL.row[k] * TL.laneH;
        const x = tlX(e[2]), w = Math.max(1, e[3] * TL.scale);
        if (x > W || x + w < TL.left) continue;
        c.fillStyle = opFill(e[0]);
        c.fillRect(x, y + 2, w, TL.laneH - 4);
        if (w > 3) { c.strokeStyle = "rgba(55,65,81,0.6)"; c.strokeRect(x, y + 2, w, TL.laneH - 4); }
        if (showCritical && critical.has(e[0])) { c.fillStyle = CRIT; c.fillRect(x, y + TL.laneH - 4, w, 2); }
        if (matchSet.has(e[0])) { c.fillStyle = MATCH; c.fillRect(x, y + 2, w, 2); }
        if (e[0] === selected || e[0] === hoverOp) selSlices.push([x, y, w]);
        if (w > 40) { c.fillStyle = "#111827"; c.fillText(fitText(c, shortLabel[e[0]], w - 4), x + 2, y + TL.laneH / 2); }
      }
    });
    c.strokeStyle = SEL; c.lineWidth = 2;
    for (const [x, y, w] of selSlices) c.strokeRect(x - 1, y + 1, w + 2, TL.laneH - 2);
    c.restore();
    c.fillStyle = "#fff"; c.fillRect(0, TL.top, TL.left - 2, H);
    c.fillStyle = "#374151";
    TL.lanes.forEach((lane) => c.fillText(fitText(c, lane.label, TL.left - 8), 4, TL.top + lane.first * TL.laneH + TL.laneH / 2));
  }
  function tlHit(cx, cy) {
    const r = tlCanvas.getBoundingClientRect();
    const x = cx - r.left, y = cy - r.top;
    const row = Math.floor((y - TL.top) / TL.laneH);
    const li = TL.lanes.findIndex((l) => row >= l.first && row < l.first + l.rows);
    if (li < 0 || x < TL.left) return -1;
    const t = TL.offset + (x - TL.left) / TL.scale, tol = 2 / TL.scale;
    let best = -1, bestDur = Infinity;
    for (const k of TL.lanes[li].events) {
      const e = T.events[k];
      if (TL.row[k] !== row) continue;
      if (t >= e[2] && t <= e[2] + e[3]) return k;          // rows never overlap
      if (t >= e[2] - tol && t <= e[2] + e[3] + tol && e[3] < bestDur) { best = k; bestDur = e[3]; }
    }
    return best;
  }
  function scrollTimelineTo(i) {
    if (!T || !slicesOf[i].length) return;
    const e = T.events[slicesOf[i][slicesOf[i].length - 1]];
    const x = tlX(e[2]);
    if (x < TL.left || x + e[3] * TL.scale > tlCanvas.width / dpr) {
      TL.offset = e[2] - (tlWidth() / 2) / TL.scale;
    }
  }
  let tlDrag = null;
  tlCanvas.addEventListener("mousedown", (ev) => { tlDrag = { x: ev.clientX, offset: TL.offset, moved: false }; });
  window.addEventListener("mousemove", (ev) => {
    if (tlDrag) {
      const dx = ev.clientX - tlDrag.x;
      if (Math.abs(dx) > 3) tlDrag.moved = true;
      TL.offset = tlDrag.offset - dx / TL.scale;
      requestDraw();
    } else if (ev.target === tlCanvas && T) {
      const k = tlHit(ev.clientX, ev.clientY);
      if (k >= 0) {
        const e = T.events[k];
        showTip(ev, "#" + e[0] + " " + D.ops[e[0]].n + " · step " + e[1] + " · " + fmtUs(e[3]));
      } else hideTip();
    }
  });
  window.addEventListener("mouseup", () => { setTimeout(() => { tlDrag = null; }, 0); });
  tlCanvas.addEventListener("click", (ev) => {
    if (tlDrag && tlDrag.moved) return;
    const k = tlHit(ev.clientX, ev.clientY);
    if (k >= 0) selectOp(T.events[k][0], "timeline");
  });
  tlCanvas.addEventListener("mouseleave", hideTip);
  tlCanvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = tlCanvas.getBoundingClientRect();
    const x = ev.clientX - r.left;
    const t = TL.offset + (x - TL.left) / TL.scale;
    const f = Math.exp(-ev.deltaY * (ev.deltaMode ? 0.05 : 0.0015));
    TL.scale = Math.max(tlWidth() / Math.max(TL.t1 - TL.t0, 1e-3) / 4, TL.scale * f);
    TL.offset = t - (x - TL.left) / TL.scale;
    requestDraw();
  }, { passive: false });
  tlCanvas.addEventListener("dblclick", () => { tlFit(); requestDraw(); });

  // ---------------------------------------------------------------- header and legend
  function header() {
    $("title").textContent = D.meta.title;
    const sub = D.meta.places.length + " place" + (D.meta.places.length === 1 ? "" : "s") + " (" +
      D.meta.places.join(", ") + ") · " + D.meta.ops + " op handles · " + D.meta.collectives +
      " collectives" + (T ? " · trace of " + (T.steps.length || "?") + " step(s)" : "");
    $("subtitle").textContent = sub;
    const st = D.meta.strategy;
    $("strategy").textContent = "BuildStrategy: " + Object.keys(st).map((k) => k + "=" + JSON.stringify(st[k])).join(", ");
    $("strategy").title = $("strategy").textContent;
    document.title = D.meta.title + " - ssaexec explorer";
    if (T) {
      $("color-by-box").hidden = false; $("critical-box").hidden = false;
      $("color-by").value = colorBy;
      $("color-by").addEventListener("change", () => { colorBy = $("color-by").value; legend(); requestDraw(); });
      $("critical").addEventListener("change", () => { showCritical = $("critical").checked; requestDraw(); });
    }
  }
  function legend() {
    const box = $("legend");
    box.replaceChildren();
    if (colorBy === "duration" && T) {
      const g = el("span", { cls: "grad" });
      g.style.background = "linear-gradient(to right, " + [0, 0.33, 0.66, 1].map((t) => heat(Math.exp(Math.log(Math.max(minDur, 1e-3)) + t * (Math.log(Math.max(maxDur, 1e-3)) - Math.log(Math.max(minDur, 1e-3)))))).join(", ") + ")";
      box.append(el("span", { cls: "item" }, "mean time " + fmtUs(minDur), g, fmtUs(maxDur)));
    } else {
      for (const k of D.kinds) box.append(el("span", { cls: "item" }, el("span", { cls: "sw", style: "background:" + k.color }), k.legend));
    }
    box.append(el("span", { cls: "item" }, el("span", { cls: "dash" }), "dummy edge (war/waw/order)"));
    if (T) box.append(el("span", { cls: "item" }, el("span", { cls: "crit" }), "critical path"));
    box.append(el("span", { cls: "item" }, el("span", { cls: "sw", style: "background:#fff;border:3px solid " + MATCH }), "match"));
  }

  // ---------------------------------------------------------------- self-test (browser tests)
  function screenOf(i) {
    const r = canvas.getBoundingClientRect();
    return [r.left + view.tx + (L.nodeX[i] + NODE_W / 2) * view.scale, r.top + view.ty + (L.nodeY[i] + NODE_H / 2) * view.scale];
  }
  function click(target, x, y) {
    target.dispatchEvent(new MouseEvent("click", { clientX: x, clientY: y, bubbles: true }));
  }
  function selfTest(params) {
    const out = { ready_ms: window.explorerReadyMs, ops: N, groups: D.groups.length,
                  opened_collapsed: collapsed.every((c) => c), visible_at_open: L.visibleCount, checks: {} };
    const ok = (name, cond, info) => { out.checks[name] = { ok: !!cond, info: info === undefined ? null : info }; };
    setAll(false); draw();
    ok("all_handles_present", L.visibleCount === N && new Set(D.ops.map((o, i) => i)).size === N, L.visibleCount);
    const q = params.get("var") || D.names[D.vars.find((v) => v[3] >= 0)[0]][0];
    setAll(true);
    const res = search(q, false);
    ok("search_finds_var", res.vars.includes(q) && res.ops.length > 0,
       { vars: res.vars.length, ops: res.ops.length, text: $("search-summary") ? $("search-summary").textContent : null });
    const first = nextMatch(1);
    ok("jump_expands_and_selects", first >= 0 && !collapsed[D.ops[first].g] && selected === first &&
       $("details-title").textContent === D.ops[first].n, first);
    const g = D.ops[first].g, before = L.visibleCount;
    setCollapsed(g, true); draw();
    const hidden = groupOps[g].every((i) => collapsed[D.ops[i].g]);
    ok("collapse_hides_members", hidden && L.visibleCount === before - D.groups[g].n, { before, after: L.visibleCount });
    // click a handle through the canvas, as a user would
    setCollapsed(g, false);
    selected = -1; showSummary();
    const target = groupOps[g][Math.floor(groupOps[g].length / 2)];
    centerOn(L.nodeX[target] + NODE_W / 2, L.nodeY[target] + NODE_H / 2, 1); draw();
    click(canvas, ...screenOf(target));
    ok("click_shows_details", selected === target && $("details-title").textContent === D.ops[target].n &&
       $("details").textContent.includes("predecessors"), D.ops[target].n);
    // click a var link in the details panel
    const link = $("details").querySelector("[data-var]");
    if (link) {
      link.click();
      ok("var_details", $("details-title").textContent === link.dataset.var &&
         $("details").querySelectorAll("[data-var-row]").length === (versionsOf.get(link.dataset.var) || []).length, link.dataset.var);
    }
    // collapse a group by clicking its header
    const b = L.groupBox[g];
    click(canvas, canvas.getBoundingClientRect().left + view.tx + (b.x + b.w / 2) * view.scale,
          canvas.getBoundingClientRect().top + view.ty + (b.y + 8) * view.scale);
    ok("header_click_collapses", collapsed[g] === true);
    if (T) {
      drawTimeline();
      ok("timeline_present", !$("timeline-pane").hidden && TL.lanes.length > 0, TL.lanes.map((l) => l.label));
      ok("critical_path", T.critical.length > 0 && showCritical, T.critical.length);
      // click the longest slice of the last step in the timeline
      let best = -1;
      T.events.forEach((e, k) => { if (best < 0 || e[3] > T.events[best][3]) best = k; });
      tlFit();
      const e = T.events[best];
      const r = tlCanvas.getBoundingClientRect();
      selected = -1;
      click(tlCanvas, r.left + tlX(e[2] + e[3] / 2), r.top + TL.top + TL.row[best] * TL.laneH + TL.laneH / 2);
      ok("timeline_selects_in_graph", selected === e[0] && !collapsed[D.ops[e[0]].g] &&
         $("details-title").textContent === D.ops[e[0]].n, { op: e[0], selected });
    }
    out.passed = Object.values(out.checks).every((c) => c.ok);
    const pre = $("selftest");
    pre.textContent = JSON.stringify(out);
    pre.hidden = false;
  }

  // ---------------------------------------------------------------- start
  header();
  legend();
  layout();
  buildTimeline();
  resize();
  tlFit();
  fit();
  draw(); drawTimeline();
  showSummary();
  window.explorerReadyMs = performance.now();
  window.addEventListener("resize", () => { resize(); });
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.has("selftest")) {
    try { selfTest(params); } catch (err) {
      const pre = $("selftest");
      pre.textContent = JSON.stringify({ passed: false, error: String(err && err.stack || err) });
      pre.hidden = false;
    }
  } else {
    if (params.get("expand") === "all") setAll(false);
    if (params.get("expand") === "none") setAll(true);
    if (params.has("search")) { $("search").value = params.get("search"); search(params.get("search"), false); }
    if (params.has("select")) selectOp(+params.get("select"), "url");
    if (params.has("zoom")) { view.scale = +params.get("zoom"); if (selected >= 0) reveal(selected, +params.get("zoom")); }
  }
  window.explorer = { data: D, layout: L, collapsed, selectOp, selectVar, search, setAll, fit, view };
})();
