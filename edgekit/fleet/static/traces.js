/* A device's slow windows on its device page: each window that missed its budget, and the traces of its
 * slowest frames (the device exported them over OTLP), linked to the trace UI the fleet server was given
 * (--trace-url); without one, the trace ids are shown to copy. Ids and URLs come from the server: text and
 * href only (el() sets textContent). */

import { clear, el } from "./dom.js";
import { fmtClock, fmtInt, fmtMs } from "./format.js";

/** Fill the panel `box` from page.slow_windows; hidden when there is none. */
export function renderSlowWindows(box, body, windows) {
  clear(body);
  if (!windows || !windows.length) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  var table = el("table", { id: "dev-traces-table" });
  var head = el("tr");
  ["window end", "missed", "frames", "slowest frames"].forEach(function (h) {
    head.appendChild(el("th", null, h));
  });
  table.appendChild(head);
  windows.forEach(function (w) {
    var tr = el("tr");
    tr.appendChild(el("td", null, fmtClock(w.end)));
    tr.appendChild(el("td", { class: "bad" }, fmtInt(w.missed)));
    tr.appendChild(el("td", null, fmtInt(w.frames)));
    var td = el("td");
    (w.traces || []).forEach(function (t) {
      var label = fmtMs(t.latency_ms) + " ms" + (t.camera ? " · " + t.camera : "") + " #" + t.index;
      var link = t.url
        ? el("a", { href: t.url, target: "_blank", rel: "noopener", class: "trace", title: t.trace_id }, label)
        : el("code", { class: "trace", title: "trace id" }, t.trace_id + " (" + label + ")");
      td.appendChild(link);
      td.appendChild(el("span", null, " "));
    });
    tr.appendChild(td);
    table.appendChild(tr);
  });
  body.appendChild(table);
}
