/* A device's cameras on its device page: per camera, its frames, those over budget, those its slot
 * dropped, and its p50/p99 over the window (from its merged sketches, server-side); then how it kept
 * delivering, as the device last said: its state (stalled: no frame for over 30 s), outages, reopens,
 * stalls, corrupt frames, size changes, seconds without frames and since its last frame.  A
 * single-source device with health has one row, "source". Camera names come from the device: text
 * only (el() sets textContent). */

import { clear, el } from "./dom.js";
import { fmtInt, fmtMs } from "./format.js";

var HEALTH = [
  ["outages", "outages"],
  ["reopens", "reopens"],
  ["stalls", "stalls"],
  ["corrupt", "corrupt"],
  ["size_changes", "size changes"],
  ["rate_changes", "rate changes"],
  ["down_s", "down s"],
  ["since_frame_s", "since frame s"],
];

function fmtSeconds(v) {
  return typeof v === "number" && isFinite(v) ? v.toFixed(1) : "–";
}

/** Fill the panel `box` from page.cameras and page.health; hidden when neither has a row. */
export function renderCameras(box, body, cameras, health) {
  clear(body);
  var byName = {};
  (health || []).forEach(function (h) {
    byName[h.name] = h;
  });
  var rows = cameras && cameras.length ? cameras : byName[""] ? [{ name: "" }] : [];
  if (!rows.length) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  var withHealth = !!(health && health.length);
  var table = el("table", { id: "dev-cameras-table" });
  var head = el("tr");
  var cols = ["camera", "frames", "missed", "dropped", "p50 ms", "p99 ms"];
  if (withHealth) cols = cols.concat(["state"], HEALTH.map(function (h) { return h[1]; }));
  cols.forEach(function (h, i) {
    head.appendChild(el("th", { class: i && h !== "state" ? "num" : null }, h));
  });
  var thead = el("thead");
  thead.appendChild(head);
  table.appendChild(thead);
  var tbody = el("tbody");
  rows.forEach(function (c) {
    var h = byName[c.name];
    var tr = el("tr", { "data-camera": c.name, "data-health": h ? h.state : null });
    tr.appendChild(el("td", { class: "name", title: c.name || "source" }, c.name || "source"));
    tr.appendChild(el("td", { class: "num", "data-field": "frames" }, fmtInt(c.frames)));
    tr.appendChild(el("td", { class: "num", "data-field": "missed" }, fmtInt(c.missed)));
    tr.appendChild(el("td", { class: "num", "data-field": "dropped" }, fmtInt(c.dropped)));
    tr.appendChild(el("td", { class: "num", "data-field": "p50" }, fmtMs(c.p50)));
    tr.appendChild(el("td", { class: "num", "data-field": "p99" }, fmtMs(c.p99)));
    if (withHealth) {
      var state = h ? h.state : "–";
      tr.appendChild(el("td", { "data-field": "state", class: state === "stalled" ? "bad" : null }, state));
      HEALTH.forEach(function (f) {
        var v = h ? h[f[0]] : null;
        var text = f[0].slice(-2) === "_s" ? fmtSeconds(v) : fmtInt(v);
        tr.appendChild(el("td", { class: "num", "data-field": f[0] }, text));
      });
    }
    tbody.appendChild(tr);
  });
  table.appendChild(tbody);
  var scroll = el("div", { class: "table-scroll" });
  scroll.appendChild(table);
  body.appendChild(scroll);
}
