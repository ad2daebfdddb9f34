/* The uPlot charts: latency percentiles against the budget (gaps shaded) and the stacked stage p50s.
 * Each chart lives in a slot, is made once and fed new data after; it is made again only when its
 * series change. uPlot is the global of the vendored script index.html loads before the modules. */

import { clear, cssVar } from "./dom.js";
import { fmtClock, fmtMs, isNum, pad } from "./format.js";
import { stageColor, stageNames } from "./stages.js";

var charts = {}; // slot -> {u, el, sig}
var chartGaps = {}; // slot -> [[t0, t1], ...] shaded behind the series

function chartHeight() {
  return window.innerWidth < 600 ? 190 : 240;
}

function axisStyle() {
  var muted = cssVar("--muted") || "#666";
  var grid = cssVar("--border") || "#ddd";
  return {
    stroke: muted,
    grid: { stroke: grid, width: 1 },
    ticks: { stroke: grid, width: 1 },
    font: "11px system-ui, sans-serif",
  };
}

function msAxis() {
  var a = axisStyle();
  a.size = 46;
  a.values = function (u, vals) {
    return vals.map(function (v) {
      return v == null ? "" : String(+v.toFixed(3));
    });
  };
  return a;
}

/** 24-hour clock ticks (uPlot's default is am/pm with a second row of dates). */
function timeAxis() {
  var a = axisStyle();
  a.space = 56;
  a.values = function (u, vals) {
    var inc = vals.length > 1 ? vals[1] - vals[0] : 60;
    var span = u.scales.x.max - u.scales.x.min;
    return vals.map(function (t) {
      if (t == null) return "";
      var d = new Date(t * 1000);
      var s = pad(d.getHours()) + ":" + pad(d.getMinutes());
      if (inc < 60) s += ":" + pad(d.getSeconds());
      if (span > 2 * 86400) s = d.getMonth() + 1 + "/" + d.getDate() + " " + s;
      return s;
    });
  };
  return a;
}

function markDrawn(u) {
  if (u.data && u.data[0] && u.data[0].length > 0 && document.body.dataset.chartsDrawn !== "1") {
    document.body.dataset.chartsDrawn = "1";
  }
}

/** Create the chart for `slot` (or recreate it when its series changed), then set its data. */
function ensureChart(slot, target, sig, makeOpts, data) {
  var c = charts[slot];
  if (c && (c.sig !== sig || c.el !== target)) {
    c.u.destroy();
    delete charts[slot];
    c = null;
  }
  var width = target.clientWidth;
  if (!c) {
    if (width <= 0) return; // hidden: drawn when shown
    clear(target);
    var opts = makeOpts();
    opts.width = width;
    opts.height = chartHeight();
    opts.hooks = opts.hooks || {};
    opts.hooks.draw = (opts.hooks.draw || []).concat([markDrawn]);
    c = charts[slot] = { u: new uPlot(opts, data, target), el: target, sig: sig };
    observeResize(target);
  } else {
    c.u.setData(data);
  }
}

var resizeObserver =
  "ResizeObserver" in window
    ? new ResizeObserver(function () {
        resizeCharts();
      })
    : null;

function observeResize(target) {
  if (resizeObserver) resizeObserver.observe(target);
}


// What every latency chart shares: a live legend, no drag-zoom, time across, milliseconds up.
function msChartOptions(series, hooks) {
  var opts = {
    legend: { live: true },
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: true }, y: { range: yRange } },
    axes: [timeAxis(), msAxis()],
    series: [{ label: "time", value: legendTime }].concat(series),
  };
  if (hooks) opts.hooks = hooks;
  return opts;
}

export function resizeCharts() {
  Object.keys(charts).forEach(function (slot) {
    var c = charts[slot];
    var w = c.el.clientWidth;
    var h = chartHeight();
    if (w > 0 && (Math.abs(c.u.width - w) > 1 || c.u.height !== h)) c.u.setSize({ width: w, height: h });
  });
}

/** Every chart gone (the theme changed: the next render makes them again in its colours). */
export function destroyCharts() {
  Object.keys(charts).forEach(function (slot) {
    charts[slot].u.destroy();
  });
  charts = {};
}

function yRange(u, min, max) {
  if (!isNum(max) || max <= 0) return [0, 1];
  return [0, max * 1.08];
}

/** Latency p50/p95/p99 with a dashed budget line; `gaps` ([[a,b],...]) shaded. */
export function drawLatency(slot, target, series, budget, gaps) {
  series = series || {};
  var t = series.t || [];
  var b = isNum(budget) ? budget : null;
  var data = [
    t,
    series.p50 || t.map(nullish),
    series.p95 || t.map(nullish),
    series.p99 || t.map(nullish),
    t.map(function () {
      return b;
    }),
  ];
  var bad = cssVar("--bad") || "#c53030";
  var accent = cssVar("--accent") || "#2f6fde";
  var shade = cssVar("--idle-bg") || "#eee";
  chartGaps[slot] = gaps || [];
  ensureChart(
    slot,
    target,
    "lat",
    function () {
      return msChartOptions(
        [
          { label: "p50", stroke: accent, width: 2, value: legendMs, points: { show: sparse, size: 5 } },
          { label: "p95", stroke: "#a673f5", width: 1.5, value: legendMs, points: { show: sparse, size: 5 } },
          { label: "p99", stroke: "#e4572e", width: 1.5, value: legendMs, points: { show: sparse, size: 5 } },
          { label: "budget", stroke: bad, width: 1.5, dash: [6, 5], value: legendMs, points: { show: false } },
        ],
        {
          drawClear: [
            function (u) {
              var gl = chartGaps[slot];
              if (!gl || !gl.length) return;
              var ctx = u.ctx;
              ctx.save();
              ctx.fillStyle = shade;
              gl.forEach(function (g) {
                var x0 = u.valToPos(g[0], "x", true);
                var x1 = u.valToPos(g[1], "x", true);
                var left = Math.max(u.bbox.left, Math.min(x0, x1));
                var right = Math.min(u.bbox.left + u.bbox.width, Math.max(x0, x1));
                if (right > left) ctx.fillRect(left, u.bbox.top, Math.max(1, right - left), u.bbox.height);
              });
              ctx.restore();
            },
          ],
        }
      );
    },
    data
  );
}

/** Dots only while a line has too few points to be seen (a fresh server has one step). */
function sparse(u) {
  return u.data[0].length <= 3;
}

function nullish() {
  return null;
}

function legendTime(u, t) {
  return t == null ? "–" : fmtClock(t);
}

function legendMs(u, v) {
  return v == null ? "–" : fmtMs(v) + " ms";
}

function hexToRgb(hex) {
  var h = hex.replace("#", "");
  if (h.length === 3) h = h[0] + h[0] + h[1] + h[1] + h[2] + h[2];
  var n = parseInt(h, 16);
  return [(n >> 16) & 255, (n >> 8) & 255, n & 255];
}

/** An opaque colour: `hex` laid over `bg` at opacity `a` (so stacked fills do not blend). */
function over(hex, bg, a) {
  var c = hexToRgb(hex);
  var b = hexToRgb(bg || "#ffffff");
  var m = c.map(function (x, i) {
    return Math.round(x * a + b[i] * (1 - a));
  });
  return "rgb(" + m.join(",") + ")";
}

/** Stage p50s stacked: each series holds the running sum, drawn largest first with an opaque fill.
 * `stageOrder` is the server's stage_names. */
export function drawStages(slot, target, stages, stageOrder) {
  stages = stages || {};
  var t = stages.t || [];
  var names = stageNames(stages, stageOrder).filter(function (s) {
    return stages[s] && stages[s].p50;
  });
  var raw = names.map(function (s) {
    return stages[s].p50;
  });
  var cum = [];
  var running = t.map(function () {
    return 0;
  });
  var any = t.map(function () {
    return false;
  });
  raw.forEach(function (arr) {
    running = running.map(function (v, i) {
      var x = arr[i];
      if (isNum(x)) any[i] = true;
      return v + (isNum(x) ? x : 0);
    });
    cum.push(running.slice());
  });
  cum = cum.map(function (arr) {
    return arr.map(function (v, i) {
      return any[i] ? v : null;
    });
  });
  // Reverse so the total (top of the stack) is drawn first and smaller sums paint over it.
  var order = names.map(function (_, i) {
    return names.length - 1 - i;
  });
  var data = [t].concat(
    order.map(function (i) {
      return cum[i];
    })
  );
  var panel = cssVar("--panel") || "#ffffff";
  ensureChart(
    slot,
    target,
    "stages:" + names.join(","),
    function () {
      return msChartOptions(
        order.map(function (i) {
            var color = stageColor(names[i], i);
            return {
              label: names[i],
              stroke: color,
              width: 1,
              fill: over(color, panel, 0.55),
              points: { show: false },
              value: function (u, v, si, idx) {
                var r = idx == null ? null : raw[i][idx];
                return r == null ? "–" : fmtMs(r) + " ms";
              },
            };
          })
      );
    },
    data
  );
  // The legend's value closure reads `raw`; keep it current without recreating the chart.
  if (charts[slot]) {
    var u = charts[slot].u;
    order.forEach(function (i, k) {
      u.series[k + 1].value = (function (arr) {
        return function (u2, v, si, idx) {
          var r = idx == null ? null : arr[idx];
          return r == null ? "–" : fmtMs(r) + " ms";
        };
      })(raw[i]);
    });
  }
}
