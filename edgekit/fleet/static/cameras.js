/* A many-camera device's cameras on its device page: per camera, its frames, those over budget, those
 * its slot dropped, and its p50/p99 over the window (from its merged sketches, server-side). Camera
 * names come from the device: text only (el() sets textContent). */

import { clear, el } from "./dom.js";
import { fmtInt, fmtMs } from "./format.js";

/** Fill the panel `box` from page.cameras; hide it for a device of one camera (page.cameras is null). */
export function renderCameras(box, body, cameras) {
  clear(body);
  if (!cameras || !cameras.length) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  var table = el("table", { id: "dev-cameras-table" });
  var head = el("tr");
  ["camera", "frames", "missed", "dropped", "p50 ms", "p99 ms"].forEach(function (h, i) {
    head.appendChild(el("th", { class: i ? "num" : null }, h));
  });
  var thead = el("thead");
  thead.appendChild(head);
  table.appendChild(thead);
  var tbody = el("tbody");
  cameras.forEach(function (c) {
    var tr = el("tr", { "data-camera": c.name });
    tr.appendChild(el("td", { class: "name", title: c.name }, c.name));
    tr.appendChild(el("td", { class: "num", "data-field": "frames" }, fmtInt(c.frames)));
    tr.appendChild(el("td", { class: "num", "data-field": "missed" }, fmtInt(c.missed)));
    tr.appendChild(el("td", { class: "num", "data-field": "dropped" }, fmtInt(c.dropped)));
    tr.appendChild(el("td", { class: "num", "data-field": "p50" }, fmtMs(c.p50)));
    tr.appendChild(el("td", { class: "num", "data-field": "p99" }, fmtMs(c.p99)));
    tbody.appendChild(tr);
  });
  table.appendChild(tbody);
  var scroll = el("div", { class: "table-scroll" });
  scroll.appendChild(table);
  body.appendChild(scroll);
}
