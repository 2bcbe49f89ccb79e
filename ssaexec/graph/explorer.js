// ssaexec explorer: shows the SSA graph data embedded in this page (ssaexec/graph/explorer.py
// says what it holds and how the layout was chosen). The graph is drawn by Cytoscape.js
// (inlined before this script; ssaexec/graph/vendor/README.md gives its version): one node
// per op handle at the position computed here from the Python-side ranks and slots (a
// "preset" layout), one compound node per group (a lane x a phase of the step) holding its
// handles. A collapsed group hides its handles (display: none) and becomes a box; only row
// heights and column widths are recomputed when a group opens or closes. Edges between
// hidden handles are aggregated per pair of visible endpoints. The timeline stays a plain
// <canvas>. Everything that reads the data goes through the tables built once below.
// `#selftest` in the URL runs selfTest() and writes its results into the selftest <pre> for
// the browser tests; `#expand=all|none&select=ID&search=TEXT&zoom=S` set the opening state
// (screenshots).
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("explorer-data").textContent);
  const T = D.trace;                       // null without a trace
  const N = D.ops.length;
  const SPAN = -1;
  // geometry, in model units (CSS pixels at zoom 1)
  const NODE_W = 150, NODE_H = 24, SLOT_W = 168, RANK_H = 36, HEAD = 28, PAD = 10;
  const COLLAPSED_W = 200, COLLAPSED_H = 64, COL_GAP = 48, ROW_GAP = 44, CELL_GAP = 16;
  const ROW_LABEL_W = 110;
  const LONG_EDGE = 24 * RANK_H;           // longer edges are drawn faint unless selected
  const CRIT = "#dc2626", SEL = "#111827", MATCH = "#f59e0b";
  const FONT = "system-ui, -apple-system, 'Segoe UI', 'DejaVu Sans', sans-serif";

  const $ = (id) => document.getElementById(id);
  const graphBox = $("graph");
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
  // a slice's label: its op's, or its compiled segment's (events of 5 entries)
  const sliceLabel = (e) => e.length > 4 ? T.segments[e[4]].n : shortLabel[e[0]];
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
  let selected = -1, selectedVar = null, hoverOp = -1;
  let matches = [], matchSet = new Set(), matchPos = -1;
  let colorBy = T ? "duration" : "kind", showCritical = !!T;
  const L = { nodeX: new Float64Array(N), nodeY: new Float64Array(N), groupBox: [], rowY: [],
              rowH: [], width: 0, height: 0, edges: [], visibleCount: 0 };

  // ---------------------------------------------------------------- layout
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

  // ---------------------------------------------------------------- the graph (Cytoscape.js)
  const opId = (i) => "o" + i, groupId = (g) => "g" + g;
  function opFill(i) {
    if (colorBy === "duration" && durColor) return durColor[i];
    const k = kindOf[D.ops[i].k];
    return k ? k.color : "#eeeeee";
  }
  const groupTime = D.groups.map(() => 0), groupCrit = D.groups.map(() => 0);
  if (T) for (let i = 0; i < N; i++) {
    if (T.mean_us[i] > 0) groupTime[D.ops[i].g] += T.mean_us[i];
    if (critical.has(i)) groupCrit[D.ops[i].g]++;
  }
  let matchCount = D.groups.map(() => 0);
  function groupLabel(g) {
    const G = D.groups[g];
    if (!collapsed[g]) return "▾ " + G.label + " (" + G.n + ")";
    let info = G.n + " handle" + (G.n === 1 ? "" : "s");
    if (matchCount[g]) info += " · " + matchCount[g] + " match";
    if (T) {
      info += " · " + fmtUs(groupTime[g]);
      if (groupCrit[g] && showCritical) info += " · " + groupCrit[g] + " critical";
    }
    return "▸ " + G.label + "\n" + info;
  }
  const STYLE = [
    { selector: "node", style: { "font-family": FONT, color: "#111827", "min-zoomed-font-size": 6 } },
    { selector: "node.op", style: {
      shape: "rectangle", width: NODE_W, height: NODE_H, "background-color": "data(fill)",
      "border-width": 1, "border-color": "#374151", label: "data(label)", "font-size": 11,
      "text-valign": "center", "text-halign": "center", "text-wrap": "ellipsis",
      "text-max-width": NODE_W - 8, "min-zoomed-font-size": 8 } },
    { selector: "node.group", style: {
      shape: "round-rectangle", width: COLLAPSED_W, height: COLLAPSED_H, padding: 0,
      "background-color": "#eef2ff", "border-width": 1, "border-color": "#6b7280",
      label: "data(label)", "font-size": 12, "text-wrap": "wrap", "text-max-width": COLLAPSED_W - 16,
      "text-valign": "center", "text-halign": "center", "text-justification": "left",
      "line-height": 1.6, "compound-sizing-wrt-labels": "exclude" } },
    { selector: "node.group.span", style: { "background-color": "#fee2e2" } },
    { selector: "node.group.open", style: {
      padding: PAD, "background-opacity": 0.45, "border-color": "#9ca3af", color: "#374151",
      "text-valign": "top", "text-margin-y": HEAD - 6, "text-wrap": "none", "text-justification": "auto", "min-height": "data(mh)", "min-height-bias-top": 100,
      "min-height-bias-bottom": 0 } },
    { selector: "node.rowlabel", style: {
      shape: "rectangle", width: 1, height: 1, "background-opacity": 0, label: "data(label)",
      "font-size": 14, "font-weight": "bold", color: "#9ca3af", "text-valign": "bottom",
      "text-halign": "right", events: "no", "min-zoomed-font-size": 4 } },
    { selector: "edge", style: {
      "curve-style": "straight", width: 1, "line-color": "#6b7280", "target-arrow-shape": "triangle",
      "target-arrow-color": "#6b7280", "arrow-scale": 0.6, "source-endpoint": "0% 50%",
      "target-endpoint": "0% -50%", events: "no" } },
    { selector: "edge.dummy", style: { "line-style": "dashed", "line-color": "#a8a29e", "target-arrow-color": "#a8a29e" } },
    { selector: "edge.faint", style: { "line-color": "#4b5563", "line-opacity": 0.12, "target-arrow-shape": "none" } },
    { selector: "edge.crit", style: { "line-color": CRIT, "target-arrow-color": CRIT, width: 2.5, "line-opacity": 1, "target-arrow-shape": "triangle", "z-index": 5 } },
    { selector: "edge.hot", style: { "line-color": "#1d4ed8", "target-arrow-color": "#1d4ed8", width: 2, "line-opacity": 1, "target-arrow-shape": "triangle", "z-index": 6 } },
    { selector: "node.match", style: { "border-color": MATCH, "border-width": 3 } },
    { selector: "node.crit", style: { "border-color": CRIT, "border-width": 3 } },
    { selector: "node.sel, node.hover", style: { "border-color": SEL, "border-width": 3 } },
    { selector: "node.op.sel", style: { "outline-width": 2, "outline-color": "#60a5fa", "outline-offset": 3 } },
  ];
  function edgeElements() {
    const out = [];
    L.edges.forEach((e, k) => {
      const ops = e.a < N && e.b < N;
      let cls = e.dummy ? "dummy" : "";
      // long edges, and edges between a handle and a collapsed group, stay in the background
      if (!ops && (e.a < N) !== (e.b < N)) cls += " faint";
      else if (ops && Math.abs(e.y2 - e.y1) > LONG_EDGE) cls += " faint";
      out.push({ group: "edges", data: { id: "e" + edgeGen + "_" + k, source: e.a < N ? opId(e.a) : groupId(e.a - N),
        target: e.b < N ? opId(e.b) : groupId(e.b - N), k }, classes: cls });
    });
    return out;
  }
  let edgeGen = 0;
  function groupData(g) {
    const b = L.groupBox[g];
    return { label: groupLabel(g), mh: Math.max(0, b.h - 2 * PAD) };
  }
  layout();
  const elements = [];
  D.groups.forEach((G, g) => {
    const b = L.groupBox[g];
    elements.push({ group: "nodes", data: { id: groupId(g), g, ...groupData(g) },
      position: { x: b.x + b.w / 2, y: b.y + b.h / 2 },
      classes: "group" + (G.lane === SPAN ? " span" : "") + (collapsed[g] ? "" : " open") });
  });
  // a group's handles are in the graph only while it is open: a collapsed group is a plain
  // node (a box); opening it adds its handles as the children of that compound node
  function opElement(i) {
    return { group: "nodes", data: { id: opId(i), parent: groupId(D.ops[i].g), i, label: shortLabel[i], fill: opFill(i) },
      position: { x: L.nodeX[i] + NODE_W / 2, y: L.nodeY[i] + NODE_H / 2 },
      classes: "op" + (matchSet.has(i) ? " match" : "") + (showCritical && critical.has(i) ? " crit" : "") +
        (i === selected ? " sel" : "") };
  }
  D.groups.forEach((_, g) => { if (!collapsed[g]) for (const i of groupOps[g]) elements.push(opElement(i)); });
  D.rows.forEach((name, r) => elements.push({ group: "nodes", data: { id: "row" + r, label: name },
    position: { x: 8, y: L.rowY[r] + 6 }, classes: "rowlabel" }));
  for (const e of edgeElements()) elements.push(e);
  const cy = cytoscape({
    container: graphBox, elements, style: STYLE, layout: { name: "preset" },
    minZoom: 0.01, maxZoom: 4, boxSelectionEnabled: false, autoungrabify: true, autounselectify: true,
    hideEdgesOnViewport: N > 1500, styleEnabled: true,
  });
  const opNode = new Array(N).fill(null), groupNode = [];   // op nodes of the open groups
  for (let g = 0; g < D.groups.length; g++) {
    groupNode.push(cy.getElementById(groupId(g)));
    if (!collapsed[g]) for (const i of groupOps[g]) opNode[i] = cy.getElementById(opId(i));
  }

  function applyLayout() {
    // positions from layout(), members shown or hidden, aggregated edges rebuilt
    layout();
    edgeGen++;
    cy.batch(() => {
      D.groups.forEach((G, g) => {
        const node = groupNode[g], b = L.groupBox[g];
        if (collapsed[g]) {
          if (node.isParent()) node.children().remove();
          for (const i of groupOps[g]) opNode[i] = null;
          node.removeClass("open");
          node.position({ x: b.x + b.w / 2, y: b.y + b.h / 2 });
        } else if (!node.isParent()) {
          const added = cy.add(groupOps[g].map(opElement));
          added.forEach((n) => { opNode[n.data("i")] = n; });
          node.addClass("open");
        } else {
          for (const i of groupOps[g]) opNode[i].position({ x: L.nodeX[i] + NODE_W / 2, y: L.nodeY[i] + NODE_H / 2 });
        }
        node.data(groupData(g));
      });
      D.rows.forEach((_, r) => cy.getElementById("row" + r).position({ x: 8, y: L.rowY[r] + 6 }));
      cy.edges().remove();
      cy.add(edgeElements());
    });
    marked.edgesFor = -2;                  // edges are new: mark them again
    syncMarks();
  }

  // marks (selection, hover, matches, critical path, colours) follow the state incrementally
  const marked = { sel: -1, hover: -1, matches: null, colorBy, critical: false, edgesFor: -2, selGroup: -1 };
  function syncMarks() {
    cy.batch(() => {
      if (marked.colorBy !== colorBy) {
        for (let i = 0; i < N; i++) if (opNode[i]) opNode[i].data("fill", opFill(i));
        marked.colorBy = colorBy;
      }
      if (marked.critical !== showCritical || marked.edgesFor === -2) {
        cy.elements(".crit").removeClass("crit");
        if (showCritical) {
          for (const i of critical) if (opNode[i]) opNode[i].addClass("crit");
          cy.edges().forEach((e) => {
            const a = L.edges[e.data("k")];
            if (a && a.a < N && a.b < N && critEdges.has(a.a * N + a.b)) e.addClass("crit");
          });
        }
        if (marked.critical !== showCritical) D.groups.forEach((_, g) => { if (groupCrit[g]) groupNode[g].data("label", groupLabel(g)); });
        marked.critical = showCritical;
      }
      if (marked.matches !== matches) {
        cy.nodes("node.op.match").removeClass("match");
        for (const i of matches) if (opNode[i]) opNode[i].addClass("match");
        const count = D.groups.map(() => 0);
        for (const i of matches) count[D.ops[i].g]++;
        const old = matchCount;
        matchCount = count;
        D.groups.forEach((_, g) => {
          if (old[g] !== count[g]) groupNode[g].data("label", groupLabel(g));
          groupNode[g].toggleClass("match", count[g] > 0);
        });
        marked.matches = matches;
      }
      if (marked.sel !== selected || marked.edgesFor !== selected) {
        cy.nodes("node.op.sel").removeClass("sel");
        if (marked.selGroup >= 0) groupNode[marked.selGroup].removeClass("sel");
        cy.edges(".hot").removeClass("hot");
        marked.selGroup = -1;
        if (selected >= 0) {
          const g = D.ops[selected].g;
          if (opNode[selected]) opNode[selected].addClass("sel");
          if (collapsed[g]) { groupNode[g].addClass("sel"); marked.selGroup = g; }
          (collapsed[g] ? groupNode[g] : opNode[selected]).connectedEdges().forEach((e) => {
            const a = L.edges[e.data("k")];
            if (a && (a.a === selected || a.b === selected)) e.addClass("hot");
          });
        }
        marked.sel = selected; marked.edgesFor = selected;
      }
      if (marked.hover !== hoverOp) {
        cy.nodes("node.op.hover").removeClass("hover");
        if (hoverOp >= 0 && opNode[hoverOp]) opNode[hoverOp].addClass("hover");
        marked.hover = hoverOp;
      }
    });
  }
  let dpr = 1, needDraw = false;
  function resize() {
    dpr = window.devicePixelRatio || 1;
    const r = tlCanvas.getBoundingClientRect();
    tlCanvas.width = Math.max(1, Math.round(r.width * dpr));
    tlCanvas.height = Math.max(1, Math.round(r.height * dpr));
    cy.resize();
    requestDraw();
  }
  function requestDraw() {
    syncMarks();
    if (needDraw) return;
    needDraw = true;
    requestAnimationFrame(() => { needDraw = false; drawTimeline(); });
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

  // ---------------------------------------------------------------- view control
  function fit() {
    const W = cy.width(), H = cy.height();
    const s = Math.min(Math.max(Math.min(W / L.width, H / L.height) * 0.96, 0.02), 2);
    cy.viewport({ zoom: s, pan: { x: (W - L.width * s) / 2, y: Math.max(8, (H - L.height * s) / 2) } });
  }
  function centerOn(x, y, minScale) {
    const z = minScale && cy.zoom() < minScale ? minScale : cy.zoom();
    cy.viewport({ zoom: z, pan: { x: cy.width() / 2 - x * z, y: cy.height() / 2 - y * z } });
  }
  function setCollapsed(g, value) {
    if (collapsed[g] === value) return;
    // keep the group's top-left corner where it is on screen
    const before = L.groupBox[g], z = cy.zoom(), pan = cy.pan();
    const sx = before.x * z + pan.x, sy = before.y * z + pan.y;
    collapsed[g] = value;
    applyLayout();
    const after = L.groupBox[g];
    cy.pan({ x: sx - after.x * z, y: sy - after.y * z });
    requestDraw();
  }
  function setAll(value) {
    collapsed.fill(value);
    applyLayout();
    fit();
  }
  function reveal(i, minScale) {
    const g = D.ops[i].g;
    if (collapsed[g]) { collapsed[g] = false; applyLayout(); }
    centerOn(L.nodeX[i] + NODE_W / 2, L.nodeY[i] + NODE_H / 2, minScale === undefined ? 0.8 : minScale);
  }
  cy.on("tap", (ev) => {
    const t = ev.target;
    if (t === cy || !t.isNode()) return;
    if (t.hasClass("op")) { selectOp(t.data("i"), "graph"); return; }
    const g = t.data("g");
    if (g === undefined) return;
    // a collapsed box expands; an open group collapses from its header
    if (collapsed[g]) setCollapsed(g, false);
    else if (ev.position.y <= L.groupBox[g].y + HEAD - 4) setCollapsed(g, true);
  });
  cy.on("mouseover", "node", (ev) => {
    const t = ev.target, oe = ev.originalEvent;
    if (t.hasClass("op")) {
      hoverOp = t.data("i"); syncMarks();
      if (oe) showTip(oe, opTip(hoverOp));
    } else if (t.data("g") !== undefined && oe) {
      const g = t.data("g");
      showTip(oe, D.groups[g].label + " · " + D.groups[g].n + " handles · click " +
        (collapsed[g] ? "to expand" : "its header to collapse"));
    }
  });
  cy.on("mouseout", "node", (ev) => {
    if (ev.target.hasClass("op") && hoverOp >= 0) { hoverOp = -1; syncMarks(); }
    hideTip();
  });
  graphBox.addEventListener("mouseleave", () => { hideTip(); if (hoverOp >= 0) { hoverOp = -1; syncMarks(); } });

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
      const sk = T.seg_of ? T.seg_of[i] : -1;
      if (sk >= 0) info.append(row("compiled in", T.segments[sk].n + " · mean " + fmtUs(T.segments[sk].mean_us)));
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
        if (w > 40) { c.fillStyle = "#111827"; c.fillText(fitText(c, sliceLabel(e), w - 4), x + 2, y + TL.laneH / 2); }
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
        showTip(ev, (e.length > 4 ? sliceLabel(e) : "#" + e[0] + " " + D.ops[e[0]].n) + " · step " + e[1] + " · " + fmtUs(e[3]));
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
  // shown as Cytoscape.js styles them (display), not as the page's own state says
  const shown = (n) => n.nonempty() && n.inside() && n.pstyle("display").value === "element";
  const shownOps = () => cy.nodes("node.op").filter(shown).length;
  const shownOp = (i) => shown(cy.getElementById(opId(i)));
  function screenOf(i) {
    const r = graphBox.getBoundingClientRect(), z = cy.zoom(), pan = cy.pan();
    const p = { x: L.nodeX[i] + NODE_W / 2, y: L.nodeY[i] + NODE_H / 2 };
    return [r.left + pan.x + p.x * z, r.top + pan.y + p.y * z];
  }
  function click(x, y) {
    // press and release at a point of the screen, as a user would: the element there gets
    // the events (Cytoscape.js turns them into a tap, the timeline into a click)
    const target = document.elementFromPoint(x, y);
    if (!target) throw new Error("no element at (" + x + ", " + y + ")");
    const opts = { clientX: x, clientY: y, bubbles: true, cancelable: true, button: 0, buttons: 1, view: window };
    target.dispatchEvent(new MouseEvent("mousedown", opts));
    target.dispatchEvent(new MouseEvent("mouseup", { ...opts, buttons: 0 }));
    target.dispatchEvent(new MouseEvent("click", { ...opts, buttons: 0 }));
  }
  function selfTest(params) {
    const out = { ready_ms: window.explorerReadyMs, ops: N, groups: D.groups.length,
                  library: "cytoscape " + cytoscape.version,
                  opened_collapsed: collapsed.every((c) => c), visible_at_open: shownOps(), checks: {} };
    const ok = (name, cond, info) => { out.checks[name] = { ok: !!cond, info: info === undefined ? null : info }; };
    setAll(false);
    const all = shownOps();
    ok("all_handles_present", all === N && cy.nodes("node.op").length === N &&
       new Set(cy.nodes("node.op").map((n) => n.data("i"))).size === N, all);
    const q = params.get("var") || D.names[D.vars.find((v) => v[3] >= 0)[0]][0];
    setAll(true);
    const res = search(q, false);
    ok("search_finds_var", res.vars.includes(q) && res.ops.length > 0 &&
       res.ops.every((i) => shownOp(i) ? opNode[i].hasClass("match") : groupNode[D.ops[i].g].hasClass("match")),
       { vars: res.vars.length, ops: res.ops.length, text: $("search-summary") ? $("search-summary").textContent : null });
    const first = nextMatch(1);
    ok("jump_expands_and_selects", first >= 0 && !collapsed[D.ops[first].g] && selected === first &&
       shownOp(first) && opNode[first].hasClass("sel") &&
       $("details-title").textContent === D.ops[first].n, first);
    const g = D.ops[first].g, before = shownOps();
    setCollapsed(g, true);
    const after = shownOps();
    const hidden = groupOps[g].every((i) => !shownOp(i));
    ok("collapse_hides_members", hidden && after === before - D.groups[g].n, { before, after });
    // click a handle in the graph, as a user would
    setCollapsed(g, false);
    selected = -1; showSummary(); syncMarks();
    const target = groupOps[g][Math.floor(groupOps[g].length / 2)];
    centerOn(L.nodeX[target] + NODE_W / 2, L.nodeY[target] + NODE_H / 2, 1);
    click(...screenOf(target));
    ok("click_shows_details", selected === target && $("details-title").textContent === D.ops[target].n &&
       $("details").textContent.includes("predecessors"), D.ops[target].n);
    // click a var link in the details panel
    const link = $("details").querySelector("[data-var]");
    if (link) {
      link.click();
      ok("var_details", $("details-title").textContent === link.dataset.var &&
         $("details").querySelectorAll("[data-var-row]").length === (versionsOf.get(link.dataset.var) || []).length, link.dataset.var);
    }
    // collapse a group by clicking its header (brought into view first)
    const b = L.groupBox[g];
    centerOn(b.x + b.w / 2, b.y + cy.height() / 3);
    const r = graphBox.getBoundingClientRect(), z = cy.zoom(), pan = cy.pan();
    click(r.left + pan.x + (b.x + b.w / 2) * z, r.top + pan.y + (b.y + 8) * z);
    ok("header_click_collapses", collapsed[g] === true && !groupOps[g].some(shownOp));
    if (T) {
      drawTimeline();
      ok("timeline_present", !$("timeline-pane").hidden && TL.lanes.length > 0, TL.lanes.map((l) => l.label));
      ok("critical_path", T.critical.length > 0 && showCritical && T.critical.every((i) => shownOp(i) ? opNode[i].hasClass("crit") : collapsed[D.ops[i].g]), T.critical.length);
      // click the longest slice in the timeline
      let best = -1;
      T.events.forEach((e, k) => { if (best < 0 || e[3] > T.events[best][3]) best = k; });
      tlFit();
      const e = T.events[best];
      const tr = tlCanvas.getBoundingClientRect();
      selected = -1;
      click(tr.left + tlX(e[2] + e[3] / 2), tr.top + TL.top + TL.row[best] * TL.laneH + TL.laneH / 2);
      ok("timeline_selects_in_graph", selected === e[0] && !collapsed[D.ops[e[0]].g] &&
         shownOp(e[0]) && opNode[e[0]].hasClass("sel") &&
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
  buildTimeline();
  resize();
  tlFit();
  fit();
  syncMarks(); drawTimeline();
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
    if (params.has("zoom")) { cy.zoom(+params.get("zoom")); if (selected >= 0) reveal(selected, +params.get("zoom")); }
  }
  window.explorer = { data: D, layout: L, collapsed, selectOp, selectVar, search, setAll, fit, cy };
})();
