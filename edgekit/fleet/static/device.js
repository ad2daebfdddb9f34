/* The device page (#/device/<fleet>/<device>): its facts, latency and stage charts, birth
 * certificate, alerts and gaps, fetched every few seconds while it is shown. */

import { renderAlerts } from "./alerts.js";
import { fetchDevicePage } from "./api.js";
import { drawLatency, drawStages } from "./charts.js";
import { renderCameras } from "./cameras.js";
import { renderDetections } from "./detections.js";
import { renderEvents } from "./events.js";
import { $, clear, el } from "./dom.js";
import { fmtAgo, fmtClock, fmtDuration, fmtFps, fmtInt, fmtMs, fmtPct, isNum, latClass, missClass } from "./format.js";
import { deviceKey } from "./route.js";
import { renderStageBars } from "./stages.js";
import { state } from "./state.js";
import { renderSlowWindows } from "./traces.js";

var DEVICE_REFRESH_MS = 2000;
var deviceTimer = null;

export function showDevice(fleet, device) {
  state.deviceKey = deviceKey(fleet, device);
  state.device = null;
  $("dev-title").textContent = state.deviceKey;
  $("dev-badge").textContent = "";
  $("dev-badge").removeAttribute("data-state");
  $("dev-sub").textContent = "loading…";
  ["dev-kpis", "dev-birth", "dev-alerts", "dev-gaps", "dev-stage-bars", "dev-detections-body", "dev-cameras-body", "dev-events-body", "dev-traces-body"].forEach(function (id) {
    clear($(id));
  });
  $("dev-detections").hidden = true;
  $("dev-cameras").hidden = true;
  $("dev-events").hidden = true;
  $("dev-traces").hidden = true;
  $("dev-missing").hidden = true;
  fetchDevice();
  if (deviceTimer) clearInterval(deviceTimer);
  deviceTimer = setInterval(fetchDevice, DEVICE_REFRESH_MS);
}

/** The page is left: stop fetching. */
export function hideDevice() {
  if (deviceTimer) clearInterval(deviceTimer);
  deviceTimer = null;
}

export function fetchDevice() {
  if (state.route.name !== "device") return;
  var key = state.deviceKey;
  var r = state.route;
  fetchDevicePage(r.fleet, r.device, state.windowS)
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

export function renderDevicePage(page) {
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
  kpi(dl, "restarts", fmtInt(d.restarts), d.restarts ? "warn" : "");
  if (page.health && page.health.length) kpi(dl, "cameras stalled", fmtInt(d.cameras_stalled), d.cameras_stalled ? "bad" : "");
  var seen = el("span", { "data-ts": isNum(d.last_seen) ? String(d.last_seen) : "" }, fmtAgo(d.last_seen));
  var box = el("div");
  box.appendChild(el("dt", null, "last seen"));
  var dd = el("dd");
  dd.appendChild(seen);
  box.appendChild(dd);
  dl.appendChild(box);

  drawLatency("dev-latency", $("dev-chart-latency"), series, isNum(budget) ? budget : series.budget_ms, page.gaps);
  drawStages("dev-stages", $("dev-chart-stages"), page.stages, page.stage_names);
  renderStageBars($("dev-stage-bars"), page.stages, page.stage_names);
  renderDetections($("dev-detections"), $("dev-detections-body"), page.detections);
  renderCameras($("dev-cameras"), $("dev-cameras-body"), page.cameras, page.health);
  renderSlowWindows($("dev-traces"), $("dev-traces-body"), page.slow_windows);
  renderEvents($("dev-events"), $("dev-events-body"), page.zones, page.events, state.route.fleet, state.route.device);

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
