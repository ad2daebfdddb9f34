/* The group tables: devices, percentiles and misses by model, by backend and by fleet. */

import { $, clear, el } from "./dom.js";
import { fmtInt, fmtMs, fmtPct, missClass } from "./format.js";

var GROUP_TITLES = { model: "By model", backend: "By backend", fleet: "By fleet" };

export function renderGroups(groups) {
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
