/* The page's routes: the fleet (#/) and one device (#/device/<fleet>/<device>). */

export function deviceKey(fleet, device) {
  return fleet + "/" + device;
}

export function deviceHref(fleet, device) {
  return "#/device/" + encodeURIComponent(fleet) + "/" + encodeURIComponent(device);
}

export function parseRoute() {
  var h = location.hash || "";
  var m = /^#\/device\/([^/]+)\/([^/]+)$/.exec(h);
  if (m) {
    try {
      return { name: "device", fleet: decodeURIComponent(m[1]), device: decodeURIComponent(m[2]) };
    } catch (e) {
      return { name: "fleet" };
    }
  }
  return { name: "fleet" };
}
