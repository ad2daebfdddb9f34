/* A detector's classes on its device page: per class, the frames with one, the objects and the best
 * score over the window, then the objects of each of the last few steps. Class names come from the
 * device: text only (el() sets textContent). */

import { clear, el } from "./dom.js";
import { fmtClock, fmtInt, isNum } from "./format.js";

/** Fill the panel `box` from page.detections; hide it for a classifier (no detections at all). */
export function renderDetections(box, body, detections) {
  clear(body);
  if (!detections) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  var classes = detections.classes || [];
  var steps = detections.t || [];
  if (!classes.length) {
    body.appendChild(el("p", { class: "muted" }, "Nothing detected in this window."));
    return;
  }
  var table = el("table", { id: "dev-detections-table" });
  var head = el("tr");
  ["class", "frames", "objects", "best score"].forEach(function (h, i) {
    head.appendChild(el("th", { class: i ? "num" : null }, h));
  });
  steps.forEach(function (t) {
    head.appendChild(el("th", { class: "num", title: "objects in the step from " + fmtClock(t) }, fmtClock(t)));
  });
  var thead = el("thead");
  thead.appendChild(head);
  table.appendChild(thead);
  var tbody = el("tbody");
  classes.forEach(function (c) {
    var tr = el("tr", { "data-class": c.name });
    tr.appendChild(el("td", { class: "name", title: c.name }, c.name));
    tr.appendChild(el("td", { class: "num" }, fmtInt(c.frames)));
    tr.appendChild(el("td", { class: "num" }, fmtInt(c.objects)));
    tr.appendChild(el("td", { class: "num" }, isNum(c.max_score) ? c.max_score.toFixed(2) : "–"));
    (c.steps || []).forEach(function (n) {
      tr.appendChild(el("td", { class: "num muted" }, fmtInt(n)));
    });
    tbody.appendChild(tr);
  });
  table.appendChild(tbody);
  var scroll = el("div", { class: "table-scroll" });
  scroll.appendChild(table);
  body.appendChild(scroll);
}
