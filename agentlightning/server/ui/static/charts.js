// Line charts drawn as SVG: no library, nothing loaded from the internet.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#3657d6", "#1f8a4c", "#c6362f", "#b7791f", "#7b3fc4", "#0f8a99", "#d4508b", "#5b6478"];

function svgEl(tag, attrs, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function fmtTick(v) {
  if (!isFinite(v)) return "";
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a >= 1000) return v.toFixed(0);
  if (a >= 10) return v.toFixed(1);
  if (a >= 0.01) return v.toFixed(3);
  return v.toExponential(1);
}

// series: [{label, color?, points: [[x, y], ...]}]. Returns an <svg> element.
function lineChart(series, opts) {
  const W = 460, H = 220, L = 52, R = 10, T = 10, B = 26;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": opts.title || "chart" });
  const all = series.flatMap((s) => s.points).filter((p) => isFinite(p[0]) && isFinite(p[1]));
  if (all.length === 0) {
    svg.appendChild(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, "no data yet"));
    return svg;
  }
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  svg.appendChild(svgEl("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
  svg.appendChild(svgEl("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    svg.appendChild(svgEl("line", { x1: L - 3, y1: sy(y), x2: W - R, y2: sy(y), stroke: "#eef0f4" }));
    svg.appendChild(svgEl("text", { x: L - 5, y: sy(y) + 3, "text-anchor": "end" }, fmtTick(y)));
  }
  for (let i = 0; i <= 4; i++) {
    const x = x0 + ((x1 - x0) * i) / 4;
    svg.appendChild(svgEl("text", { x: sx(x), y: H - B + 14, "text-anchor": "middle" }, Number.isInteger(Math.round(x * 10) / 10) ? String(Math.round(x)) : x.toFixed(1)));
  }
  svg.appendChild(svgEl("text", { x: W - R, y: H - 2, "text-anchor": "end" }, opts.xLabel || "step"));
  series.forEach((s, i) => {
    const pts = s.points.filter((p) => isFinite(p[0]) && isFinite(p[1])).sort((a, b) => a[0] - b[0]);
    const color = s.color || PALETTE[i % PALETTE.length];
    if (pts.length > 1) {
      const d = pts.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
      svg.appendChild(svgEl("path", { d, fill: "none", stroke: color, "stroke-width": 1.8, "data-series": s.label }));
    }
    for (const p of pts.length <= 60 ? pts : []) {
      svg.appendChild(svgEl("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.4, fill: color, "data-series": s.label }));
    }
    if (pts.length === 1) {
      svg.appendChild(svgEl("circle", { cx: sx(pts[0][0]), cy: sy(pts[0][1]), r: 3, fill: color, "data-series": s.label }));
    }
  });
  return svg;
}

window.aglCharts = { lineChart, PALETTE };
