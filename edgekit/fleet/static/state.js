/* The dashboard's shared state: the chosen window, the last snapshot and device page, the route, the
 * device table's sort, and the server's clock (device times are the server's, not the browser's). */

export const state = {
  windowS: 300,
  snap: null,
  receivedAt: 0,
  skew: 0, // server clock - browser clock, seconds
  route: { name: "fleet" },
  sort: { key: "name", dir: 1 },
  device: null, // last device-page JSON
  deviceKey: "",
};

export function serverNow() {
  return Date.now() / 1000 + state.skew;
}
