/* The miss-rate heatmap: one row per device, one cell per step, drawn on a canvas (row labels and
 * the time axis are HTML, so untrusted names stay text), its hover tip and its colour legend. */

import { $, clear, cssVar, el } from "./dom.js";
import { fmtClock, fmtPct, isNum } from "./format.js";

var HEAT_STOPS = [
  [0, [52, 168, 112]],
  [0.34, [196, 200, 70]],
  [0.67, [236, 140, 50]],
  [1, [214, 48, 49]],
];

/** 0 -> green; 0.01 % .. 10 % on a log scale -> yellow, orange, red. */
function heatPos(r) {
  if (r <= 0) return 0;
  return Math.max(0.04, Math.min(1, (Math.log(r) / Math.LN10 + 4) / 3));
}

function heatColor(r) {
  var p = heatPos(r);
  for (var i = 1; i < HEAT_STOPS.length; i++) {
    if (p <= HEAT_STOPS[i][0]) {
      var a = HEAT_STOPS[i - 1];
      var b = HEAT_STOPS[i];
      var f = (p - a[0]) / (b[0] - a[0]);
      var c = a[1].map(function (x, j) {
        return Math.round(x + (b[1][j] - x) * f);
      });
      return "rgb(" + c.join(",") + ")";
    }
  }
  return "rgb(" + HEAT_STOPS[HEAT_STOPS.length - 1][1].join(",") + ")";
}

var heat = { data: null, step: 0, rowH: 18 };

export function renderHeatmap(hm, step) {
  heat.data = hm || { t: [], devices: [], miss_rate: [] };
  heat.step = step || 0;
  drawHeatmap();
}

export function drawHeatmap() {
  var hm = heat.data;
  if (!hm) return;
  var canvas = $("heat-canvas");
  var body = canvas.parentNode;
  var labels = $("heat-labels");
  var t = hm.t || [];
  var devs = hm.devices || [];
  var width = body.clientWidth;
  if (width <= 0) return;
  var n = devs.length;
  var rowH = n <= 14 ? 18 : Math.max(5, Math.floor(280 / n));
  heat.rowH = rowH;
  var height = Math.max(rowH, n * rowH);
  var dpr = window.devicePixelRatio || 1;
  canvas.style.height = height + "px";
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  var ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  var empty = cssVar("--idle-bg") || "#eee";
  var cols = t.length;
  var cw = cols ? width / cols : width;
  var gap = cw > 6 && rowH > 8 ? 1 : 0;
  for (var r = 0; r < n; r++) {
    var row = (hm.miss_rate && hm.miss_rate[r]) || [];
    for (var c = 0; c < cols; c++) {
      var v = row[c];
      ctx.fillStyle = isNum(v) ? heatColor(v) : empty;
      var x0 = Math.round(c * cw);
      ctx.fillRect(x0, r * rowH, Math.max(1, Math.round((c + 1) * cw) - x0 - gap), rowH - gap);
    }
  }
  if (!cols || !n) {
    ctx.fillStyle = empty;
    ctx.fillRect(0, 0, width, height);
  }
  // Row labels (HTML text, so untrusted names stay text).
  clear(labels);
  devs.forEach(function (name) {
    var d = el("div", { title: name }, rowH >= 12 ? name : "");
    d.style.height = rowH + "px";
    d.style.lineHeight = rowH + "px";
    labels.appendChild(d);
  });
  var axis = $("heat-axis");
  clear(axis);
  if (cols) {
    var withSeconds = (heat.step || 60) < 60;
    var ticks = Math.min(cols, Math.max(2, Math.min(5, Math.floor(width / (withSeconds ? 130 : 110)))));
    for (var k = 0; k < ticks; k++) {
      var idx = ticks > 1 ? Math.round((k * (cols - 1)) / (ticks - 1)) : 0;
      var clock = fmtClock(t[idx]);
      var span = el("span", null, withSeconds ? clock.slice(-8) : clock.slice(-8, -3));
      var x = (idx + 0.5) * cw;
      span.style.left = x + "px";
      span.style.transform = k === 0 ? "none" : k === ticks - 1 ? "translateX(-100%)" : "translateX(-50%)";
      if (k === 0) span.style.left = "0px";
      if (k === ticks - 1) {
        span.style.left = "auto";
        span.style.right = "0px";
        span.style.transform = "none";
      }
      axis.appendChild(span);
    }
  }
}

export function heatHover(ev) {
  var hm = heat.data;
  var tip = $("heat-tip");
  var canvas = $("heat-canvas");
  if (!hm || !hm.t || !hm.t.length) {
    tip.hidden = true;
    return;
  }
  var rect = canvas.getBoundingClientRect();
  var x = ev.clientX - rect.left;
  var y = ev.clientY - rect.top;
  var c = Math.floor((x / rect.width) * hm.t.length);
  var r = Math.floor(y / heat.rowH);
  if (c < 0 || c >= hm.t.length || r < 0 || r >= hm.devices.length) {
    tip.hidden = true;
    return;
  }
  var v = hm.miss_rate[r] ? hm.miss_rate[r][c] : null;
  tip.textContent = hm.devices[r] + " · " + fmtClock(hm.t[c]) + " · " + (isNum(v) ? fmtPct(v) + " missed" : "no data");
  tip.hidden = false;
  var left = Math.min(ev.clientX + 12, window.innerWidth - tip.offsetWidth - 8);
  tip.style.left = Math.max(4, left) + "px";
  tip.style.top = ev.clientY + 14 + "px";
}

export function buildHeatLegend() {
  var legend = $("heat-legend");
  clear(legend);
  var scale = el("div", { class: "scale" });
  var cv = el("canvas", { width: "200", height: "10", "aria-hidden": "true" });
  var ctx = cv.getContext("2d");
  for (var x = 0; x < 200; x++) {
    var p = x / 199;
    // invert heatPos for the gradient: position p -> rate 10^(3p-4); p 0 is "no misses"
    ctx.fillStyle = heatColor(p === 0 ? 0 : Math.pow(10, 3 * p - 4));
    ctx.fillRect(x, 0, 1, 10);
  }
  scale.appendChild(cv);
  var ticks = el("div", { class: "ticks" });
  ["0", "0.1%", "1%", "≥10%"].forEach(function (s) {
    ticks.appendChild(el("span", null, s));
  });
  scale.appendChild(ticks);
  legend.appendChild(el("span", null, "missed"));
  legend.appendChild(scale);
  var nd = el("span");
  var sw = el("span", { class: "swatch" });
  sw.style.background = cssVar("--idle-bg") || "#eee";
  sw.style.outline = "1px solid " + (cssVar("--border") || "#ccc");
  nd.appendChild(sw);
  nd.appendChild(document.createTextNode("no data"));
  legend.appendChild(nd);
}
