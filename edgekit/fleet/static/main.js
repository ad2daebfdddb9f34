/* edgekit fleet dashboard: plain JS modules, no build step; this one starts the page.
 *
 * It holds what ties the parts together: a snapshot arriving (header, table, charts, heatmap,
 * groups), the route (fleet or one device), the window buttons, and the once-a-second ticks. */

import { renderAlerts, tickAlertAges } from "./alerts.js";
import { destroyCharts, drawLatency, drawStages, resizeCharts } from "./charts.js";
import { fetchDevice, hideDevice, renderDevicePage, showDevice } from "./device.js";
import { $ } from "./dom.js";
import { fmtClock, fmtDuration, fmtFps, fmtInt, fmtMs, fmtPct, isNum, latClass, missClass } from "./format.js";
import { renderGroups } from "./groups.js";
import { buildHeatLegend, drawHeatmap, heatHover, renderHeatmap } from "./heatmap.js";
import { connect } from "./live.js";
import { parseRoute } from "./route.js";
import { renderStageBars } from "./stages.js";
import { state } from "./state.js";
import { bindSortHeaders, renderDevices, tickLastSeen } from "./table.js";

var WINDOWS = [300, 900, 3600, 21600, 86400];

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
  // What the collector refused (a device over its quota, bad input): the total, by reason on hover.
  var rejected = (snap.collector || {}).rejected || {};
  var reasons = Object.keys(rejected).sort();
  var total = reasons.reduce(function (n, k) { return n + (isNum(rejected[k]) ? rejected[k] : 0); }, 0);
  var refused = $("kpi-refused");
  refused.textContent = snap.collector ? fmtInt(total) : "–";
  refused.className = total > 0 ? "bad" : "";
  refused.title = reasons.map(function (k) { return k + ": " + fmtInt(rejected[k]); }).join("\n");
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
  drawStages("fleet-stages", $("chart-stages"), snap.stages, snap.stage_names);
  renderStageBars($("stage-bars"), snap.stages, snap.stage_names);
  renderHeatmap(snap.heatmap, snap.step_s);
  renderGroups(snap.groups || {});
}

// ---------- routing, window, boot ----------

function onRoute() {
  state.route = parseRoute();
  var dev = state.route.name === "device";
  $("fleet-view").hidden = dev;
  $("device-view").hidden = !dev;
  if (dev) {
    showDevice(state.route.fleet, state.route.device);
    window.scrollTo(0, 0);
  } else {
    hideDevice();
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
    connect(onSnapshot);
    if (state.route.name === "device") fetchDevice();
  }
}

/** The colour scheme changed: charts and the legend are drawn again in the theme's colours. */
function redrawAll() {
  destroyCharts();
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
  bindSortHeaders();
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
  connect(onSnapshot);
}

// Module scripts run once the document is parsed; the check keeps boot() right if that ever changes.
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
else boot();
