/* edgekit fleet dashboard: plain JS, no build step.
 *
 * Live data comes as `snapshot` events over SSE (/api/events?window=S); when SSE fails the page polls
 * /api/fleet. Everything the server sends is untrusted text (device names come from the field), so
 * the DOM is built with createElement + textContent only, never innerHTML with data.
 */
(function () {
  "use strict";

  var WINDOWS = [300, 900, 3600, 21600, 86400];
  var STAGES = ["capture_wait", "preprocess", "inference", "postprocess", "sink"];
  var STAGE_COLORS = {
    capture_wait: "#94a3b8",
    preprocess: "#2bb3a3",
    inference: "#4f7cff",
    postprocess: "#a673f5",
    sink: "#e0a53a",
  };
  var EXTRA_COLORS = ["#d9628e", "#6fbf4a", "#c28a5a", "#5aa9d9"];
  var POLL_MS = 2000;
  var DEVICE_REFRESH_MS = 2000;
  var SSE_RETRY_MS = 30000;

  var state = {
    windowS: 300,
    snap: null,
    receivedAt: 0,
    skew: 0, // server clock - browser clock, seconds
    route: { name: "fleet" },
    sort: { key: "name", dir: 1 },
    device: null, // last device-page JSON
    deviceKey: "",
  };

  // ---------- small helpers ----------

  function $(id) {
    return document.getElementById(id);
  }

  /** createElement with text and attributes; text always goes through textContent. */
  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (Object.prototype.hasOwnProperty.call(attrs, k) && attrs[k] != null) node.setAttribute(k, attrs[k]);
      }
    }
    if (text != null) node.textContent = String(text);
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function isNum(v) {
    return typeof v === "number" && isFinite(v);
  }

  function serverNow() {
    return Date.now() / 1000 + state.skew;
  }

  function pad(n) {
    return n < 10 ? "0" + n : String(n);
  }

  function fmtClock(t) {
    if (!isNum(t)) return "–";
    var d = new Date(t * 1000);
    var s = pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
    var now = new Date(serverNow() * 1000);
    if (d.toDateString() !== now.toDateString()) {
      s = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + s;
    }
    return s;
  }

  function fmtDuration(sec) {
    if (!isNum(sec)) return "–";
    sec = Math.max(0, sec);
    if (sec < 60) return Math.floor(sec) + " s";
    if (sec < 3600) return Math.floor(sec / 60) + " min";
    if (sec < 86400) {
      var h = Math.floor(sec / 3600);
      var m = Math.floor((sec % 3600) / 60);
      return h + " h" + (m ? " " + m + " min" : "");
    }
    var d = Math.floor(sec / 86400);
    var hh = Math.floor((sec % 86400) / 3600);
    return d + " d" + (hh ? " " + hh + " h" : "");
  }

  function fmtAgo(t) {
    if (!isNum(t)) return "never";
    var sec = serverNow() - t;
    if (sec < 1.5) return "just now";
    return fmtDuration(sec) + " ago";
  }

  function fmtMs(v) {
    if (!isNum(v)) return "–";
    if (v < 10) return v.toFixed(2);
    if (v < 100) return v.toFixed(1);
    return v.toFixed(0);
  }

  function fmtMsUnit(v) {
    return isNum(v) ? fmtMs(v) + " ms" : "–";
  }

  function fmtFps(v) {
    if (!isNum(v)) return "–";
    return v < 100 ? v.toFixed(1) : v.toFixed(0);
  }

  function fmtPct(r) {
    if (!isNum(r)) return "–";
    if (r === 0) return "0%";
    var p = r * 100;
    if (p < 0.01) return "<0.01%";
    if (p < 10) return p.toFixed(2) + "%";
    return p.toFixed(1) + "%";
  }

  function fmtInt(n) {
    if (!isNum(n)) return "–";
    return Math.round(n).toLocaleString("en-US");
  }

  /** Colour class of a latency against its budget: ok, warn (over 80 %), bad (over budget). */
  function latClass(v, budget) {
    if (!isNum(v)) return "nodata";
    if (!isNum(budget) || budget <= 0) return "";
    if (v > budget) return "bad";
    if (v > 0.8 * budget) return "warn";
    return "ok";
  }

  function missClass(r) {
    if (!isNum(r)) return "nodata";
    if (r > 0.05) return "bad";
    if (r > 0.01) return "warn";
    return "";
  }

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
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

  function deviceKey(fleet, device) {
    return fleet + "/" + device;
  }

  function deviceHref(fleet, device) {
    return "#/device/" + encodeURIComponent(fleet) + "/" + encodeURIComponent(device);
  }

  function stageColor(name, i) {
    return STAGE_COLORS[name] || EXTRA_COLORS[i % EXTRA_COLORS.length];
  }

  function stageNames(stages) {
    if (!stages) return [];
    var names = STAGES.filter(function (s) {
      return stages[s] || (stages.totals && stages.totals[s]);
    });
    Object.keys(stages).forEach(function (k) {
      if (k !== "t" && k !== "totals" && names.indexOf(k) < 0 && stages[k] && typeof stages[k] === "object") {
        names.push(k);
      }
    });
    return names;
  }

  // ---------- connection: SSE, falling back to polling ----------

  var es = null;
  var pollTimer = null;
  var lastSseAttempt = 0;

  function setConn(kind) {
    var node = $("conn");
    node.dataset.conn = kind;
    var text = {
      connecting: "connecting…",
      live: "live",
      reconnecting: "reconnecting…",
      polling: "polling",
      down: "server unreachable",
    }[kind];
    $("conn-text").textContent = text || kind;
  }

  function connect() {
    if (es) {
      es.close();
      es = null;
    }
    stopPolling();
    if (!("EventSource" in window)) {
      startPolling();
      return;
    }
    setConn("connecting");
    lastSseAttempt = Date.now();
    var src = new EventSource("/api/events?window=" + state.windowS);
    es = src;
    src.addEventListener("snapshot", function (ev) {
      if (es !== src) return;
      var snap;
      try {
        snap = JSON.parse(ev.data);
      } catch (e) {
        return;
      }
      stopPolling();
      setConn("live");
      onSnapshot(snap);
    });
    src.onerror = function () {
      if (es !== src) return;
      if (src.readyState === 2) es = null; // CLOSED: the browser gives up; polling takes over
      setConn(es ? "reconnecting" : "polling");
      startPolling();
    };
  }

  function startPolling() {
    if (pollTimer) return;
    pollTimer = setInterval(pollOnce, POLL_MS);
    pollOnce();
  }

  function stopPolling() {
    if (pollTimer) clearInterval(pollTimer);
    pollTimer = null;
  }

  function pollOnce() {
    var w = state.windowS;
    if (!es && Date.now() - lastSseAttempt > SSE_RETRY_MS) {
      connect(); // try SSE again now and then; it stops polling once a snapshot arrives
      startPolling();
      return;
    }
    fetch("/api/fleet?window=" + w, { cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (snap) {
        if (!pollTimer || w !== state.windowS) return;
        setConn(es && es.readyState === 1 ? "live" : "polling");
        onSnapshot(snap);
      })
      .catch(function () {
        if (pollTimer) setConn("down");
      });
  }

  // ---------- snapshot ----------

  function onSnapshot(snap) {
    if (!snap || typeof snap !== "object") return;
    state.snap = snap;
    state.receivedAt = Date.now();
    if (isNum(snap.now)) state.skew = snap.now - Date.now() / 1000;
    if (isNum(snap.window_s)) document.body.dataset.window = String(snap.window_s);
    renderHeader(snap);
    renderUpdated();
    if (state.route.name === "fleet") renderFleet(snap);
  }

  function renderHeader(snap) {
    var f = snap.fleet || {};
    var budget = f.budget_ms;
    $("kpi-online").textContent = isNum(f.online) ? f.online : "–";
    var off = $("kpi-offline");
    off.textContent = isNum(f.offline) ? f.offline : "–";
    off.className = f.offline > 0 ? "bad" : "";
    $("kpi-fps").textContent = fmtFps(f.fps);
    ["p50", "p95", "p99"].forEach(function (k) {
      var node = $("kpi-" + k);
      node.textContent = fmtMs(f[k]);
      node.className = latClass(f[k], budget);
    });
    $("kpi-budget").textContent = fmtMs(budget);
    var miss = $("kpi-miss");
    miss.textContent = fmtPct(f.miss_rate);
    miss.className = missClass(f.miss_rate);
    miss.title = isNum(f.missed) ? fmtInt(f.missed) + " of " + fmtInt(f.frames) + " frames over budget" : "";
  }

  function renderUpdated() {
    var node = $("updated");
    if (!state.snap) {
      node.textContent = "";
      return;
    }
    var age = (Date.now() - state.receivedAt) / 1000;
    var text = "updated " + fmtClock(state.snap.now);
    if (age > 5) text += " (" + fmtDuration(age) + " old)";
    node.textContent = text;
  }

  function renderFleet(snap) {
    renderAlerts($("alerts"), snap.alerts || [], true);
    $("alerts-count").textContent = (snap.alerts || []).length ? String(snap.alerts.length) : "";
    renderDevices(snap.devices || []);
    drawLatency("fleet-latency", $("chart-latency"), snap.series, snap.series && snap.series.budget_ms, null);
    drawStages("fleet-stages", $("chart-stages"), snap.stages);
    renderStageBars($("stage-bars"), snap.stages);
    renderHeatmap(snap.heatmap, snap.step_s);
    renderGroups(snap.groups || {});
  }

  // ---------- alerts ----------

  function renderAlerts(list, alerts, withDevice) {
    clear(list);
    if (!alerts.length) {
      list.appendChild(el("li", { class: "none" }, "No alerts: every device is online and within its budget."));
      return;
    }
    var order = { critical: 0, warning: 1 };
    alerts = alerts.slice().sort(function (a, b) {
      return (order[a.severity] || 2) - (order[b.severity] || 2) || (a.since || 0) - (b.since || 0);
    });
    alerts.forEach(function (a) {
      var li = el("li", { "data-severity": a.severity || "warning", "data-kind": a.kind || "" });
      li.dataset.device = deviceKey(a.fleet, a.device);
      li.appendChild(el("span", { class: "kind" }, a.kind === "offline" ? "offline" : a.kind === "slo" ? "SLO" : a.kind));
      if (withDevice) li.appendChild(el("span", { class: "who" }, deviceKey(a.fleet, a.device)));
      var since = isNum(a.since) ? fmtClock(a.since) + " (" + fmtDuration(serverNow() - a.since) + ")" : "";
      var text;
      if (a.kind === "offline") text = "offline since " + since;
      else text = (a.detail || "") + (since ? " · since " + since : "");
      var detail = el("span", { class: "detail" }, text);
      if (isNum(a.since)) detail.dataset.since = String(a.since);
      detail.dataset.kind = a.kind || "";
      detail.dataset.text = a.detail || "";
      if (a.kind === "offline" && a.detail) detail.title = a.detail;
      li.appendChild(detail);
      if (a.kind !== "offline" && a.detail == null) detail.textContent = "since " + since;
      li.addEventListener("click", function () {
        location.hash = deviceHref(a.fleet, a.device);
      });
      list.appendChild(li);
    });
  }

  /** The "(2 min)" in alerts ticks every second without waiting for the next snapshot. */
  function tickAlertAges() {
    var nodes = document.querySelectorAll(".alerts .detail[data-since]");
    for (var i = 0; i < nodes.length; i++) {
      var d = nodes[i];
      var since = Number(d.dataset.since);
      var s = fmtClock(since) + " (" + fmtDuration(serverNow() - since) + ")";
      d.textContent = d.dataset.kind === "offline" ? "offline since " + s : (d.dataset.text ? d.dataset.text + " · since " : "since ") + s;
    }
  }

  // ---------- device table ----------

  var COLUMNS = [
    "name",
    "state",
    "profile",
    "model",
    "backend",
    "precision",
    "fps",
    "p50",
    "p99",
    "budget_ms",
    "miss_rate",
    "last_seen",
  ];
  var OPTIONAL = { profile: 1, backend: 1, precision: 1, budget_ms: 1 };
  var NUMERIC = { fps: 1, p50: 1, p99: 1, budget_ms: 1, miss_rate: 1, last_seen: 1 };
  var rows = {}; // key -> <tr>

  function sortValue(d, key) {
    switch (key) {
      case "state":
        return d.state === "offline" ? 0 : d.state === "online" ? 1 : 2;
      case "name":
        return deviceKey(d.fleet, d.device).toLowerCase();
      case "model":
        return ((d.model || "") + " " + (d.version || "")).toLowerCase();
      default:
        var v = d[key];
        return typeof v === "string" ? v.toLowerCase() : v;
    }
  }

  function compareDevices(a, b) {
    var key = state.sort.key;
    var va = sortValue(a, key);
    var vb = sortValue(b, key);
    var na = va == null;
    var nb = vb == null;
    if (na || nb) {
      if (!(na && nb)) return na ? 1 : -1; // missing values last, whichever the direction
    } else if (va < vb) return -state.sort.dir;
    else if (va > vb) return state.sort.dir;
    var ka = deviceKey(a.fleet, a.device);
    var kb = deviceKey(b.fleet, b.device);
    return ka < kb ? -1 : ka > kb ? 1 : 0;
  }

  function makeRow(key) {
    var tr = el("tr", { tabindex: "0" });
    tr.dataset.device = key;
    COLUMNS.forEach(function (c) {
      var cls = [];
      if (NUMERIC[c]) cls.push("num");
      if (OPTIONAL[c]) cls.push("opt");
      if (c === "name") cls.push("name");
      tr.appendChild(el("td", { class: cls.join(" ") || null, "data-col": c }));
    });
    tr.addEventListener("click", function (ev) {
      if (ev.target && ev.target.tagName === "A") return;
      location.hash = tr.dataset.href;
    });
    tr.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter") location.hash = tr.dataset.href;
    });
    return tr;
  }

  function fillRow(tr, d) {
    var cells = tr.children;
    var budget = d.budget_ms;
    tr.dataset.href = deviceHref(d.fleet, d.device);
    tr.dataset.stateRow = d.state || "unknown";
    var st = cells[1];
    var stateName = d.state === "online" || d.state === "offline" ? d.state : "unknown";
    st.dataset.state = stateName;
    clear(st);
    var badge = el("span", { class: "badge", "data-state": stateName }, stateName);
    if (isNum(d.since)) badge.title = stateName + " since " + fmtClock(d.since);
    st.appendChild(badge);

    var name = cells[0];
    clear(name);
    var link = el("a", { href: tr.dataset.href });
    link.appendChild(el("span", { class: "fleet" }, d.fleet + "/"));
    link.appendChild(document.createTextNode(d.device));
    name.appendChild(link);
    name.title = deviceKey(d.fleet, d.device);

    cells[2].textContent = d.profile || "–";
    var model = cells[3];
    clear(model);
    model.appendChild(document.createTextNode(d.model || "–"));
    if (d.version) model.appendChild(el("span", { class: "ver" }, " " + d.version));
    cells[4].textContent = d.backend || "–";
    cells[5].textContent = d.precision || "–";
    cells[6].textContent = fmtFps(d.fps);
    cells[7].textContent = fmtMs(d.p50);
    cells[7].className = "num " + latClass(d.p50, budget);
    cells[8].textContent = fmtMs(d.p99);
    cells[8].className = "num " + latClass(d.p99, budget);
    cells[8].title = d.slo === "breach" ? "over budget (SLO breach)" : "";
    cells[9].textContent = isNum(budget) ? fmtMs(budget) + " ms" : "–";
    cells[10].textContent = fmtPct(d.miss_rate);
    cells[10].className = "num " + missClass(d.miss_rate);
    if (isNum(d.frames)) cells[10].title = fmtInt(d.frames) + " frames";
    cells[11].dataset.ts = isNum(d.last_seen) ? String(d.last_seen) : "";
    cells[11].textContent = fmtAgo(d.last_seen);
    cells[11].title = isNum(d.last_seen) ? fmtClock(d.last_seen) : "";
  }

  function renderDevices(devices) {
    var tbody = $("devices").tBodies[0];
    var seen = {};
    var sorted = devices.slice().sort(compareDevices);
    sorted.forEach(function (d) {
      var key = deviceKey(d.fleet, d.device);
      seen[key] = 1;
      var tr = rows[key] || (rows[key] = makeRow(key));
      fillRow(tr, d);
      tbody.appendChild(tr); // appending an attached row moves it: this also sorts
    });
    Object.keys(rows).forEach(function (k) {
      if (!seen[k]) {
        if (rows[k].parentNode) rows[k].parentNode.removeChild(rows[k]);
        delete rows[k];
      }
    });
    $("devices-count").textContent = devices.length ? String(devices.length) : "";
    $("devices-empty").hidden = devices.length > 0;
    var ths = $("devices").tHead.rows[0].cells;
    for (var i = 0; i < ths.length; i++) {
      var k = ths[i].dataset.sort;
      if (k === state.sort.key) ths[i].setAttribute("aria-sort", state.sort.dir > 0 ? "ascending" : "descending");
      else ths[i].removeAttribute("aria-sort");
    }
  }

  function tickLastSeen() {
    var cells = document.querySelectorAll("td[data-ts]");
    for (var i = 0; i < cells.length; i++) {
      var ts = cells[i].dataset.ts;
      cells[i].textContent = ts ? fmtAgo(Number(ts)) : "never";
    }
  }

  // ---------- charts (uPlot) ----------

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

  function resizeCharts() {
    Object.keys(charts).forEach(function (slot) {
      var c = charts[slot];
      var w = c.el.clientWidth;
      var h = chartHeight();
      if (w > 0 && (Math.abs(c.u.width - w) > 1 || c.u.height !== h)) c.u.setSize({ width: w, height: h });
    });
  }

  function yRange(u, min, max) {
    if (!isNum(max) || max <= 0) return [0, 1];
    return [0, max * 1.08];
  }

  /** Latency p50/p95/p99 with a dashed budget line; `gaps` ([[a,b],...]) shaded. */
  function drawLatency(slot, target, series, budget, gaps) {
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
        return {
          legend: { live: true },
          cursor: { drag: { x: false, y: false } },
          scales: { x: { time: true }, y: { range: yRange } },
          axes: [timeAxis(), msAxis()],
          series: [
            { label: "time", value: legendTime },
            { label: "p50", stroke: accent, width: 2, value: legendMs, points: { show: sparse, size: 5 } },
            { label: "p95", stroke: "#a673f5", width: 1.5, value: legendMs, points: { show: sparse, size: 5 } },
            { label: "p99", stroke: "#e4572e", width: 1.5, value: legendMs, points: { show: sparse, size: 5 } },
            { label: "budget", stroke: bad, width: 1.5, dash: [6, 5], value: legendMs, points: { show: false } },
          ],
          hooks: {
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
          },
        };
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

  /** Stage p50s stacked: each series holds the running sum, drawn largest first with an opaque fill. */
  function drawStages(slot, target, stages) {
    stages = stages || {};
    var t = stages.t || [];
    var names = stageNames(stages).filter(function (s) {
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
        return {
          legend: { live: true },
          cursor: { drag: { x: false, y: false } },
          scales: { x: { time: true }, y: { range: yRange } },
          axes: [timeAxis(), msAxis()],
          series: [{ label: "time", value: legendTime }].concat(
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
          ),
        };
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

  /** One bar split by each stage's share of the summed p50s, with p50/p99 per stage. */
  function renderStageBars(node, stages) {
    clear(node);
    var totals = (stages && stages.totals) || {};
    var names = stageNames(stages).filter(function (s) {
      return totals[s];
    });
    if (!names.length) return;
    var sum = names.reduce(function (acc, s) {
      return acc + (isNum(totals[s].p50) ? totals[s].p50 : 0);
    }, 0);
    var bar = el("div", { class: "stage-bar", role: "img", "aria-label": "share of p50 per stage" });
    var keys = el("div", { class: "stage-keys" });
    names.forEach(function (s, i) {
      var v = totals[s];
      var color = stageColor(s, i);
      if (sum > 0 && isNum(v.p50)) {
        var seg = el("span");
        seg.style.width = ((100 * v.p50) / sum).toFixed(2) + "%";
        seg.style.background = color;
        seg.title = s + " p50 " + fmtMsUnit(v.p50);
        bar.appendChild(seg);
      }
      var k = el("span");
      var sw = el("i");
      sw.style.background = color;
      k.appendChild(sw);
      k.appendChild(document.createTextNode(s + " "));
      k.appendChild(el("b", null, fmtMs(v.p50)));
      k.appendChild(document.createTextNode(" / " + fmtMs(v.p99) + " ms"));
      keys.appendChild(k);
    });
    node.appendChild(bar);
    node.appendChild(keys);
    var hint = el("div", { class: "stage-keys" }, "p50 / p99 over the window");
    node.appendChild(hint);
  }

  // ---------- miss-rate heatmap ----------

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

  function renderHeatmap(hm, step) {
    heat.data = hm || { t: [], devices: [], miss_rate: [] };
    heat.step = step || 0;
    drawHeatmap();
  }

  function drawHeatmap() {
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

  function heatHover(ev) {
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

  function buildHeatLegend() {
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

  // ---------- groups ----------

  var GROUP_TITLES = { model: "By model", backend: "By backend", fleet: "By fleet" };

  function renderGroups(groups) {
    var node = $("groups");
    clear(node);
    ["model", "backend", "fleet"].forEach(function (g) {
      var list = groups[g] || [];
      var box = el("div");
      box.appendChild(el("h3", null, GROUP_TITLES[g]));
      var wrap = el("div", { class: "table-scroll" });
      var table = el("table", { "data-group": g });
      var head = el("tr");
      [
        ["", ""],
        ["Devices", "num"],
        ["p50", "num"],
        ["p95", "num opt"],
        ["p99", "num"],
        ["Missed", "num"],
      ].forEach(function (h) {
        head.appendChild(el("th", { class: h[1] || null }, h[0]));
      });
      var thead = el("thead");
      thead.appendChild(head);
      table.appendChild(thead);
      var tbody = el("tbody");
      list.forEach(function (row) {
        var tr = el("tr");
        tr.style.cursor = "default";
        tr.appendChild(el("td", null, row.key));
        tr.appendChild(el("td", { class: "num" }, fmtInt(row.devices)));
        tr.appendChild(el("td", { class: "num" }, fmtMs(row.p50)));
        tr.appendChild(el("td", { class: "num opt" }, fmtMs(row.p95)));
        tr.appendChild(el("td", { class: "num" }, fmtMs(row.p99)));
        tr.appendChild(el("td", { class: "num " + missClass(row.miss_rate) }, fmtPct(row.miss_rate)));
        tbody.appendChild(tr);
      });
      if (!list.length) {
        var tr = el("tr");
        tr.appendChild(el("td", { colspan: "6", class: "muted" }, "no data"));
        tbody.appendChild(tr);
      }
      table.appendChild(tbody);
      wrap.appendChild(table);
      box.appendChild(wrap);
      node.appendChild(box);
    });
  }

  // ---------- device page ----------

  var deviceTimer = null;

  function showDevice(fleet, device) {
    state.deviceKey = deviceKey(fleet, device);
    state.device = null;
    $("dev-title").textContent = state.deviceKey;
    $("dev-badge").textContent = "";
    $("dev-badge").removeAttribute("data-state");
    $("dev-sub").textContent = "loading…";
    ["dev-kpis", "dev-birth", "dev-alerts", "dev-gaps", "dev-stage-bars"].forEach(function (id) {
      clear($(id));
    });
    $("dev-missing").hidden = true;
    fetchDevice();
    if (deviceTimer) clearInterval(deviceTimer);
    deviceTimer = setInterval(fetchDevice, DEVICE_REFRESH_MS);
  }

  function fetchDevice() {
    if (state.route.name !== "device") return;
    var key = state.deviceKey;
    var r = state.route;
    var url =
      "/api/device/" + encodeURIComponent(r.fleet) + "/" + encodeURIComponent(r.device) + "?window=" + state.windowS;
    fetch(url, { cache: "no-store" })
      .then(function (res) {
        if (res.status === 404) return { missing: true };
        if (!res.ok) throw new Error("HTTP " + res.status);
        return res.json();
      })
      .then(function (page) {
        if (state.route.name !== "device" || state.deviceKey !== key) return;
        if (page.missing) {
          $("dev-sub").textContent = "";
          $("dev-missing").hidden = false;
          $("dev-missing").textContent = "This device is unknown to the fleet server.";
          return;
        }
        state.device = page;
        renderDevicePage(page);
      })
      .catch(function () {
        if (state.route.name === "device" && !state.device) $("dev-sub").textContent = "could not load the device";
      });
  }

  function kpi(dl, label, value, cls, unit) {
    var box = el("div");
    box.appendChild(el("dt", null, label));
    var dd = el("dd");
    dd.appendChild(el("span", { class: cls || null }, value));
    if (unit) dd.appendChild(el("small", { class: "muted" }, " " + unit));
    box.appendChild(dd);
    dl.appendChild(box);
  }

  function renderDevicePage(page) {
    var d = page.device || {};
    var birth = page.birth || {};
    var badge = $("dev-badge");
    var stateName = d.state === "online" || d.state === "offline" ? d.state : "unknown";
    badge.dataset.state = stateName;
    badge.className = "badge";
    badge.textContent = stateName + (isNum(d.since) ? " since " + fmtClock(d.since) : "");
    var sub = [d.profile, [d.model, d.version].filter(Boolean).join(" "), [d.backend, d.precision].filter(Boolean).join(" · ")]
      .filter(Boolean)
      .join("  ·  ");
    $("dev-sub").textContent = sub;
    var budget = d.budget_ms;
    var series = page.series || {};
    var last = function (arr) {
      if (!arr) return null;
      for (var i = arr.length - 1; i >= 0; i--) if (isNum(arr[i])) return arr[i];
      return null;
    };
    var dl = $("dev-kpis");
    clear(dl);
    kpi(dl, "fps", fmtFps(d.fps));
    kpi(dl, "p50", fmtMs(d.p50), latClass(d.p50, budget), "ms");
    kpi(dl, "p95 (last step)", fmtMs(last(series.p95)), latClass(last(series.p95), budget), "ms");
    kpi(dl, "p99", fmtMs(d.p99), latClass(d.p99, budget), "ms");
    kpi(dl, "budget", fmtMs(budget), "", "ms");
    kpi(dl, "missed", fmtPct(d.miss_rate), missClass(d.miss_rate));
    kpi(dl, "frames", fmtInt(d.frames));
    var seen = el("span", { "data-ts": isNum(d.last_seen) ? String(d.last_seen) : "" }, fmtAgo(d.last_seen));
    var box = el("div");
    box.appendChild(el("dt", null, "last seen"));
    var dd = el("dd");
    dd.appendChild(seen);
    box.appendChild(dd);
    dl.appendChild(box);

    drawLatency("dev-latency", $("dev-chart-latency"), series, isNum(budget) ? budget : series.budget_ms, page.gaps);
    drawStages("dev-stages", $("dev-chart-stages"), page.stages);
    renderStageBars($("dev-stage-bars"), page.stages);

    var bdl = $("dev-birth");
    clear(bdl);
    var facts = flattenBirth(birth);
    if (!facts.length) bdl.appendChild(el("dd", { class: "muted" }, "no birth certificate received yet"));
    facts.forEach(function (f) {
      bdl.appendChild(el("dt", null, BIRTH_LABELS[f[0]] || f[0]));
      var v = el("dd", null, f[1]);
      if (f[0].indexOf("sha256") >= 0 && f[1].length > 20) {
        v.textContent = f[1].slice(0, 16) + "…";
        v.title = f[1];
      }
      bdl.appendChild(v);
    });

    renderAlerts($("dev-alerts"), page.alerts || [], false);
    var gl = $("dev-gaps");
    clear(gl);
    var gaps = page.gaps || [];
    if (!gaps.length) gl.appendChild(el("li", { class: "muted" }, "No gaps in this window."));
    gaps.forEach(function (g) {
      gl.appendChild(
        el("li", null, fmtClock(g[0]) + " → " + fmtClock(g[1]) + "  (" + fmtDuration(g[1] - g[0]) + ")")
      );
    });
  }

  var BIRTH_ORDER = [
    "model.name",
    "model.version",
    "model.sha256",
    "model.artifact",
    "model.artifact_sha256",
    "candidate",
    "backend",
    "precision",
    "budget_ms",
    "profile",
    "source",
    "policy",
    "session",
    "edgekit",
    "ts",
  ];

  var BIRTH_LABELS = { ts: "born", budget_ms: "budget", "model.name": "model", "model.version": "version" };

  function flattenBirth(birth) {
    var out = [];
    var skip = { schema: 1, state: 1, device: 1, fleet: 1 };
    Object.keys(birth).forEach(function (k) {
      if (skip[k]) return;
      var v = birth[k];
      if (v && typeof v === "object" && !Array.isArray(v)) {
        Object.keys(v).forEach(function (k2) {
          out.push([k + "." + k2, v[k2]]);
        });
      } else out.push([k, v]);
    });
    out.sort(function (a, b) {
      var ia = BIRTH_ORDER.indexOf(a[0]);
      var ib = BIRTH_ORDER.indexOf(b[0]);
      if (ia < 0) ia = 999;
      if (ib < 0) ib = 999;
      return ia - ib || (a[0] < b[0] ? -1 : 1);
    });
    return out.map(function (f) {
      var k = f[0];
      var v = f[1];
      var text;
      if (v == null) text = "–";
      else if (k === "ts" && isNum(v)) text = fmtClock(v);
      else if (k === "budget_ms" && isNum(v)) text = fmtMs(v) + " ms";
      else if (typeof v === "object") text = JSON.stringify(v);
      else text = String(v);
      return [k, text];
    });
  }

  // ---------- routing, window, boot ----------

  function parseRoute() {
    var h = location.hash || "";
    var m = /^#\/device\/([^/]+)\/([^/]+)$/.exec(h);
    if (m) {
      try {
        return { name: "device", fleet: decodeURIComponent(m[1]), device: decodeURIComponent(m[2]) };
      } catch (e) {
        return { name: "fleet" };
      }
    }
    return { name: "fleet" };
  }

  function onRoute() {
    state.route = parseRoute();
    var dev = state.route.name === "device";
    $("fleet-view").hidden = dev;
    $("device-view").hidden = !dev;
    if (dev) {
      showDevice(state.route.fleet, state.route.device);
      window.scrollTo(0, 0);
    } else {
      if (deviceTimer) clearInterval(deviceTimer);
      deviceTimer = null;
      document.title = "edgekit fleet";
      if (state.snap) renderFleet(state.snap);
    }
    if (dev) document.title = state.deviceKey + " · edgekit fleet";
    resizeCharts();
  }

  function setWindow(w, reconnect) {
    state.windowS = w;
    var buttons = document.querySelectorAll(".windows button");
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].setAttribute("aria-checked", Number(buttons[i].dataset.window) === w ? "true" : "false");
    }
    try {
      localStorage.setItem("edgekit.fleet.window", String(w));
    } catch (e) {
      /* storage may be off; the window still applies to this page */
    }
    if (reconnect) {
      connect();
      if (state.route.name === "device") fetchDevice();
    }
  }

  function redrawAll() {
    Object.keys(charts).forEach(function (slot) {
      charts[slot].u.destroy();
    });
    charts = {};
    buildHeatLegend();
    if (state.snap && state.route.name === "fleet") renderFleet(state.snap);
    if (state.device && state.route.name === "device") renderDevicePage(state.device);
  }

  function boot() {
    var saved = 300;
    try {
      saved = Number(localStorage.getItem("edgekit.fleet.window")) || 300;
    } catch (e) {
      saved = 300;
    }
    if (WINDOWS.indexOf(saved) < 0) saved = 300;
    setWindow(saved, false);
    var buttons = document.querySelectorAll(".windows button");
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].addEventListener("click", function (ev) {
        var w = Number(ev.currentTarget.dataset.window);
        if (w !== state.windowS) setWindow(w, true);
      });
    }
    var ths = $("devices").tHead.rows[0].cells;
    for (var j = 0; j < ths.length; j++) {
      ths[j].addEventListener("click", function (ev) {
        var k = ev.currentTarget.dataset.sort;
        if (state.sort.key === k) state.sort.dir = -state.sort.dir;
        else state.sort = { key: k, dir: NUMERIC[k] && k !== "last_seen" ? -1 : 1 };
        if (state.snap) renderDevices(state.snap.devices || []);
      });
    }
    var canvas = $("heat-canvas");
    canvas.addEventListener("mousemove", heatHover);
    canvas.addEventListener("mouseleave", function () {
      $("heat-tip").hidden = true;
    });
    buildHeatLegend();
    window.addEventListener("hashchange", onRoute);
    var heatW = 0;
    window.addEventListener("resize", function () {
      resizeCharts();
      var w = $("heat-canvas").parentNode.clientWidth;
      if (w !== heatW) {
        heatW = w;
        drawHeatmap();
      }
    });
    if (window.matchMedia) {
      var mq = window.matchMedia("(prefers-color-scheme: dark)");
      if (mq.addEventListener) mq.addEventListener("change", redrawAll);
    }
    setInterval(function () {
      tickLastSeen();
      tickAlertAges();
      renderUpdated();
    }, 1000);
    onRoute();
    connect();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
  else boot();
})();
