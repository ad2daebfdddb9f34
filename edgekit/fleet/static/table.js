/* The device table: one row per device, kept across snapshots (rows are updated and moved, not
 * rebuilt), sorted by the clicked column; "last seen" ticks every second between snapshots. */

import { $, clear, el } from "./dom.js";
import { fmtAgo, fmtClock, fmtFps, fmtInt, fmtMs, fmtPct, isNum, latClass, missClass } from "./format.js";
import { deviceHref, deviceKey } from "./route.js";
import { state } from "./state.js";

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

export function renderDevices(devices) {
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

/** A click on a column head sorts by it (numbers largest first, except last seen); again reverses. */
export function bindSortHeaders() {
  var ths = $("devices").tHead.rows[0].cells;
  for (var j = 0; j < ths.length; j++) {
    ths[j].addEventListener("click", function (ev) {
      var k = ev.currentTarget.dataset.sort;
      if (state.sort.key === k) state.sort.dir = -state.sort.dir;
      else state.sort = { key: k, dir: NUMERIC[k] && k !== "last_seen" ? -1 : 1 };
      if (state.snap) renderDevices(state.snap.devices || []);
    });
  }
}

export function tickLastSeen() {
  var cells = document.querySelectorAll("td[data-ts]");
  for (var i = 0; i < cells.length; i++) {
    var ts = cells[i].dataset.ts;
    cells[i].textContent = ts ? fmtAgo(Number(ts)) : "never";
  }
}
