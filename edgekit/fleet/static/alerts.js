/* The alert lists (the fleet's and a device's): offline devices and SLO breaches, worst first; their
 * "(2 min)" ages tick every second between snapshots. */

import { clear, el } from "./dom.js";
import { fmtClock, fmtDuration, isNum } from "./format.js";
import { deviceHref, deviceKey } from "./route.js";
import { serverNow } from "./state.js";

export function renderAlerts(list, alerts, withDevice) {
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
export function tickAlertAges() {
  var nodes = document.querySelectorAll(".alerts .detail[data-since]");
  for (var i = 0; i < nodes.length; i++) {
    var d = nodes[i];
    var since = Number(d.dataset.since);
    var s = fmtClock(since) + " (" + fmtDuration(serverNow() - since) + ")";
    d.textContent = d.dataset.kind === "offline" ? "offline since " + s : (d.dataset.text ? d.dataset.text + " · since " : "since ") + s;
  }
}
