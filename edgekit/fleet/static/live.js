/* The live connection: snapshots as SSE `snapshot` events; when SSE fails the page polls
 * /api/fleet, and tries SSE again now and then. The header's dot and text say which. */

import { eventsUrl, fetchFleet } from "./api.js";
import { $ } from "./dom.js";
import { state } from "./state.js";

var POLL_MS = 2000;
var SSE_RETRY_MS = 30000;

var es = null;
var pollTimer = null;
var lastSseAttempt = 0;
var onSnapshot = function () {};

function setConn(kind) {
  var node = $("conn");
  node.dataset.conn = kind;
  var text = {
    connecting: "connecting…",
    live: "live",
    reconnecting: "reconnecting…",
    polling: "polling",
    down: "server unreachable",
  }[kind];
  $("conn-text").textContent = text || kind;
}

/** (Re)connect for the current window; every snapshot, streamed or polled, goes to `handler`. */
export function connect(handler) {
  if (handler) onSnapshot = handler;
  if (es) {
    es.close();
    es = null;
  }
  stopPolling();
  if (!("EventSource" in window)) {
    startPolling();
    return;
  }
  setConn("connecting");
  lastSseAttempt = Date.now();
  var src = new EventSource(eventsUrl(state.windowS));
  es = src;
  src.addEventListener("snapshot", function (ev) {
    if (es !== src) return;
    var snap;
    try {
      snap = JSON.parse(ev.data);
    } catch (e) {
      return;
    }
    stopPolling();
    setConn("live");
    onSnapshot(snap);
  });
  src.onerror = function () {
    if (es !== src) return;
    if (src.readyState === 2) es = null; // CLOSED: the browser gives up; polling takes over
    setConn(es ? "reconnecting" : "polling");
    startPolling();
  };
}

function startPolling() {
  if (pollTimer) return;
  pollTimer = setInterval(pollOnce, POLL_MS);
  pollOnce();
}

function stopPolling() {
  if (pollTimer) clearInterval(pollTimer);
  pollTimer = null;
}

function pollOnce() {
  var w = state.windowS;
  if (!es && Date.now() - lastSseAttempt > SSE_RETRY_MS) {
    connect(); // try SSE again now and then; it stops polling once a snapshot arrives
    startPolling();
    return;
  }
  fetchFleet(w)
    .then(function (snap) {
      if (!pollTimer || w !== state.windowS) return;
      setConn(es && es.readyState === 1 ? "live" : "polling");
      onSnapshot(snap);
    })
    .catch(function () {
      if (pollTimer) setConn("down");
    });
}
