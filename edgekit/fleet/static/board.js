/* The large-fleet board: every list, sort and filter is the server's (GET /api/v2/...), a page at a time. */

var PAGE = 50;
var state = { q: "", state: "", sort: "worst", offset: 0, by: "site", group: null };

function $(id) { return document.getElementById(id); }
function el(tag, attrs, text) {
  var e = document.createElement(tag);
  for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function ms(v) { return v === null || v === undefined ? "–" : v.toFixed(v < 10 ? 1 : 0) + " ms"; }
function pct(v) { return v === null || v === undefined ? "–" : (v * 100).toFixed(v < 0.01 ? 2 : 1) + "%"; }
function get(url) {
  return fetch(url, { cache: "no-store" }).then(function (r) {
    if (!r.ok) throw new Error("HTTP " + r.status + " " + url);
    return r.json();
  });
}

function summary() {
  return get("/api/v2/summary").then(function (s) {
    $("k-devices").textContent = s.devices;
    $("k-online").textContent = s.states.online || 0;
    $("k-offline").textContent = s.states.offline || 0;
    $("k-over").textContent = s.over_budget;
    $("k-p50").textContent = ms(s.p50);
    $("k-p99").textContent = ms(s.p99);
    $("k-missed").textContent = pct(s.missed_share);
  });
}

/* One line per kind of alert: 12 offline devices are one alert with 12 members. */
function alerts() {
  return get("/api/v2/alerts").then(function (a) {
    var box = $("alerts");
    box.textContent = "";
    a.alerts.forEach(function (g) {
      var d = el("details", { class: g.severity, "data-kind": g.kind });
      var what = g.kind === "offline" ? "offline" : "over their latency budget";
      d.appendChild(el("summary", {}, g.count + (g.count === 1 ? " device " : " devices ") + what));
      var ul = el("ul");
      g.members.forEach(function (m) { ul.appendChild(el("li", {}, m.device)); });
      if (g.count > g.members.length) ul.appendChild(el("li", {}, "… and " + (g.count - g.members.length) + " more"));
      d.appendChild(ul);
      box.appendChild(d);
    });
  });
}

/* Groups as a heatmap: a square a group (a few hundred sites fit one screen), its colour the share of
   its devices offline or over their own budget; a click lists that group's devices. */
function groups() {
  return get("/api/v2/groups?by=" + state.by).then(function (g) {
    var heat = $("heat");
    heat.textContent = "";
    var few = g.groups.length <= 12;  // few groups: a labelled chip each, not anonymous squares
    g.groups.forEach(function (x) {
      var bad = (x.offline + x.over_budget) / x.devices;
      var b = el("button", { type: "button", class: few ? "wide" : "", "data-key": x.key === null ? "" : x.key,
        title: (x.key || "?") + ": " + x.devices + " devices, " + x.offline + " offline, " + x.over_budget + " over budget" }, few ? (x.key || "?") + " " + x.devices : null);
      b.style.background = "hsl(" + Math.round(120 * (1 - Math.min(1, bad * 4))) + " 60% 45%)";
      if (few) b.style.color = "#fff";
      if (state.group === x.key) b.classList.add("picked");
      b.addEventListener("click", function () { pick(x.key); });
      heat.appendChild(b);
    });
  });
}

function pick(key) {
  state.group = key;
  state.offset = 0;
  $("chip").hidden = key === null;
  $("unfilter").textContent = state.by + ": " + key + " ×";
  groups();
  list();
}

/* p99 against the device's own budget (the mark is its budget): devices differ, so no fleet line. */
function bar(row) {
  var box = el("div", { class: "bar", title: row.budget_ms ? "budget " + row.budget_ms + " ms" : "no budget" });
  if (row.over_budget !== null) {
    var i = el("i", { class: row.over_budget > 1 ? "over" : "" });
    i.style.width = Math.min(100, row.over_budget * 50) + "%";
    box.appendChild(i);
    box.appendChild(el("b"));
  }
  return box;
}

function list() {
  var p = new URLSearchParams({ sort: state.sort, limit: PAGE, offset: state.offset });
  if (state.q) p.set("q", state.q);
  if (state.state) p.set("state", state.state);
  if (state.group !== null) p.set(state.by, state.group);
  return get("/api/v2/devices?" + p).then(function (page) {
    var body = document.querySelector("#devices tbody");
    body.textContent = "";
    page.devices.forEach(function (r) {
      var tr = el("tr", { class: r.state, "data-device": r.device, "data-fleet": r.fleet });
      tr.appendChild(el("td", { class: "name" }, r.device));
      tr.appendChild(el("td", { class: "site" }, r.site || "–"));
      tr.appendChild(el("td", { class: "what" }, (r.profile || "?") + " · " + (r.model || "?") + " " + (r.version || "")));
      tr.appendChild(el("td", { class: "n", "data-label": "p50" }, ms(r.p50)));
      tr.appendChild(el("td", { class: "n", "data-label": "p99" }, ms(r.p99)));
      var cell = el("td", { class: "bar-cell" });
      cell.appendChild(bar(r));
      tr.appendChild(cell);
      tr.appendChild(el("td", { class: "n", "data-label": "missed" }, pct(r.missed_share)));
      tr.addEventListener("click", function () { device(r.fleet, r.device); });
      body.appendChild(tr);
    });
    var last = Math.min(page.offset + page.devices.length, page.total);
    $("count").textContent = page.total + " devices" + (state.q ? " match" : "");
    $("page").textContent = (page.total ? page.offset + 1 : 0) + "–" + last + " of " + page.total;
    $("prev").disabled = page.offset === 0;
    $("next").disabled = last >= page.total;
  });
}

/* A device's p99 over the last day, drawn against its own budget. */
function device(fleet, name) {
  get("/api/v2/device/" + encodeURIComponent(fleet) + "/" + encodeURIComponent(name) + "?range=1d").then(function (d) {
    var box = $("device");
    box.hidden = false;
    box.textContent = "";
    box.appendChild(el("h2", {}, d.device + " · " + (d.site || "") + " · " + (d.profile || "") + " · budget " + ms(d.budget_ms)));
    var pts = d.series.filter(function (s) { return s.p99 !== null; });
    if (!pts.length) { box.appendChild(el("p", {}, "no telemetry in the last day")); return; }
    var t0 = pts[0].t, t1 = pts[pts.length - 1].t || t0 + 1;
    var top = Math.max(d.budget_ms || 0, Math.max.apply(null, pts.map(function (s) { return s.p99; }))) * 1.1;
    var svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 1000 160");
    svg.setAttribute("preserveAspectRatio", "none");
    function y(v) { return (160 - (v / top) * 160).toFixed(1); }
    function x(t) { return ((t - t0) / Math.max(1, t1 - t0) * 1000).toFixed(1); }
    var line = document.createElementNS(svg.namespaceURI, "polyline");
    line.setAttribute("points", pts.map(function (s) { return x(s.t) + "," + y(s.p99); }).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "currentColor");
    svg.appendChild(line);
    if (d.budget_ms) {
      var b = document.createElementNS(svg.namespaceURI, "line");
      b.setAttribute("x1", 0); b.setAttribute("x2", 1000); b.setAttribute("y1", y(d.budget_ms)); b.setAttribute("y2", y(d.budget_ms));
      b.setAttribute("stroke", "#c62828"); b.setAttribute("stroke-dasharray", "6 4");
      svg.appendChild(b);
    }
    box.appendChild(svg);
    box.scrollIntoView({ block: "nearest" });
  });
}

var typing = null;
$("q").addEventListener("input", function () {
  clearTimeout(typing);
  typing = setTimeout(function () { state.q = $("q").value.trim(); state.offset = 0; list(); }, 200);
});
$("state").addEventListener("change", function () { state.state = $("state").value; state.offset = 0; list(); });
$("sort").addEventListener("change", function () { state.sort = $("sort").value; state.offset = 0; list(); });
$("prev").addEventListener("click", function () { state.offset = Math.max(0, state.offset - PAGE); list(); });
$("next").addEventListener("click", function () { state.offset += PAGE; list(); });
$("by").addEventListener("change", function () { state.by = $("by").value; pick(null); });
$("unfilter").addEventListener("click", function () { pick(null); });
$("filters").addEventListener("submit", function (e) { e.preventDefault(); });

Promise.all([summary(), alerts(), groups(), list()]).then(function () {
  document.body.setAttribute("data-ready", "1");
}, function (err) {
  document.body.setAttribute("data-error", String(err));
});
