/* A device's zone and line events on its device page: what its zones and lines counted over the
 * window (enters, leaves, the highest occupancy; crossings per direction), then its newest events,
 * each with its snapshot (loaded when scrolled to) and a link to its clip where the device keeps them.
 * Names come from the device: text only (el() sets textContent). */

import { clear, el } from "./dom.js";
import { fmtClock, fmtInt, isNum } from "./format.js";

function table(id, headings) {
  var t = el("table", { id: id });
  var head = el("tr");
  headings.forEach(function (h) {
    head.appendChild(el("th", { class: h.num ? "num" : null }, h.text));
  });
  var thead = el("thead");
  thead.appendChild(head);
  t.appendChild(thead);
  return t;
}

function scroll(node) {
  var box = el("div", { class: "table-scroll" });
  box.appendChild(node);
  return box;
}

/** What an event says besides its kind and place: a direction, a stay, a class and track. */
function detail(e) {
  var parts = [];
  if (e.class_name) parts.push(e.class_name + (e.track_id != null ? " #" + e.track_id : ""));
  if (e.direction) parts.push(e.direction);
  if (isNum(e.dwell_s)) parts.push(e.dwell_s.toFixed(1) + " s");
  if (e.kind === "count" && e.counts) {
    var n = 0;
    Object.keys(e.counts.zones || {}).forEach(function (z) {
      var byClass = (e.counts.zones[z] || {}).enter || {};
      Object.keys(byClass).forEach(function (c) {
        n += byClass[c];
      });
    });
    parts.push(fmtInt(n) + " entered");
  }
  return parts.join(" · ");
}

/** The URL of an event's proof file on the fleet server, which fetches it from the device. */
function proofUrl(fleet, device, e, name) {
  return ["/api/device", encodeURIComponent(fleet), encodeURIComponent(device), "events", encodeURIComponent(e.id), name].join("/");
}

/** The snapshot thumbnail (a link to the full size) and a clip link of an event the device has proof of. */
function proofCell(fleet, device, e) {
  var td = el("td", { class: "proof" });
  var p = e.proof || {};
  if (p.snapshot != null) {
    var url = proofUrl(fleet, device, e, "snapshot.jpg");
    var a = el("a", { href: url, target: "_blank", rel: "noopener" });
    a.appendChild(el("img", { src: url, loading: "lazy", alt: "snapshot", class: "proof-thumb" }));
    td.appendChild(a);
  }
  if (p.clip != null) {
    td.appendChild(el("a", { href: proofUrl(fleet, device, e, "clip.avi"), class: "proof-clip" }, "clip"));
  }
  return td;
}

/** Fill the panel `box` from page.zones and page.events; hidden when the device sent no event. */
export function renderEvents(box, body, zones, events, fleet, device) {
  clear(body);
  zones = zones || [];
  events = events || [];
  if (!zones.length && !events.length) {
    box.hidden = true;
    return;
  }
  box.hidden = false;
  if (zones.length) {
    var directions = [];
    zones.forEach(function (z) {
      if (z.type !== "line") return;
      Object.keys(z).forEach(function (k) {
        if (["camera", "type", "name"].indexOf(k) < 0 && directions.indexOf(k) < 0) directions.push(k);
      });
    });
    var cols = ["enter", "leave", "occupancy"].concat(directions);
    var zt = table(
      "dev-zones-table",
      [{ text: "camera" }, { text: "zone or line" }].concat(
        cols.map(function (c) {
          return { text: c === "occupancy" ? "most inside" : c, num: true };
        })
      )
    );
    var zb = el("tbody");
    zones.forEach(function (z) {
      var tr = el("tr", { "data-zone": z.name });
      tr.appendChild(el("td", { class: "name" }, z.camera));
      tr.appendChild(el("td", { class: "name", title: z.type }, z.name));
      cols.forEach(function (c) {
        tr.appendChild(el("td", { class: "num" }, isNum(z[c]) ? fmtInt(z[c]) : ""));
      });
      zb.appendChild(tr);
    });
    zt.appendChild(zb);
    body.appendChild(scroll(zt));
  }
  if (events.length) {
    var et = table("dev-events-table", [
      { text: "time" },
      { text: "camera" },
      { text: "event" },
      { text: "zone or line" },
      { text: "" },
      { text: "proof" },
    ]);
    var eb = el("tbody");
    events.forEach(function (e) {
      var tr = el("tr", { "data-event": e.id });
      tr.appendChild(el("td", { title: e.id }, fmtClock(e.t)));
      tr.appendChild(el("td", { class: "name" }, e.camera));
      tr.appendChild(el("td", null, e.kind));
      tr.appendChild(el("td", { class: "name" }, e.zone || ""));
      tr.appendChild(el("td", { class: "muted" }, detail(e)));
      tr.appendChild(proofCell(fleet, device, e));
      eb.appendChild(tr);
    });
    et.appendChild(eb);
    body.appendChild(scroll(et));
  }
}
