/* The server's JSON API: the fleet snapshot, a device's page, and the URL of the live event stream. */

/** The fleet snapshot over the last `windowS` seconds (GET /api/fleet). */
export function fetchFleet(windowS) {
  return fetch("/api/fleet?window=" + windowS, { cache: "no-store" }).then(function (r) {
    if (!r.ok) throw new Error("HTTP " + r.status);
    return r.json();
  });
}

/** One device's page (GET /api/device/<fleet>/<device>); `{missing: true}` for a device never seen. */
export function fetchDevicePage(fleet, device, windowS) {
  var url = "/api/device/" + encodeURIComponent(fleet) + "/" + encodeURIComponent(device) + "?window=" + windowS;
  return fetch(url, { cache: "no-store" }).then(function (res) {
    if (res.status === 404) return { missing: true };
    if (!res.ok) throw new Error("HTTP " + res.status);
    return res.json();
  });
}

/** The SSE stream of `snapshot` events for a window (sent when something changed). */
export function eventsUrl(windowS) {
  return "/api/events?window=" + windowS;
}
