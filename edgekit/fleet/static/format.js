/* How numbers and times read on the dashboard: clock times, durations, ms, fps, percentages, and the
 * colour classes of a latency against its budget and of a miss rate. */

import { serverNow } from "./state.js";

export function isNum(v) {
  return typeof v === "number" && isFinite(v);
}

export function pad(n) {
  return n < 10 ? "0" + n : String(n);
}

export function fmtClock(t) {
  if (!isNum(t)) return "–";
  var d = new Date(t * 1000);
  var s = pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  var now = new Date(serverNow() * 1000);
  if (d.toDateString() !== now.toDateString()) {
    s = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + s;
  }
  return s;
}

export function fmtDuration(sec) {
  if (!isNum(sec)) return "–";
  sec = Math.max(0, sec);
  if (sec < 60) return Math.floor(sec) + " s";
  if (sec < 3600) return Math.floor(sec / 60) + " min";
  if (sec < 86400) {
    var h = Math.floor(sec / 3600);
    var m = Math.floor((sec % 3600) / 60);
    return h + " h" + (m ? " " + m + " min" : "");
  }
  var d = Math.floor(sec / 86400);
  var hh = Math.floor((sec % 86400) / 3600);
  return d + " d" + (hh ? " " + hh + " h" : "");
}

export function fmtAgo(t) {
  if (!isNum(t)) return "never";
  var sec = serverNow() - t;
  if (sec < 1.5) return "just now";
  return fmtDuration(sec) + " ago";
}

export function fmtMs(v) {
  if (!isNum(v)) return "–";
  if (v < 10) return v.toFixed(2);
  if (v < 100) return v.toFixed(1);
  return v.toFixed(0);
}

export function fmtMsUnit(v) {
  return isNum(v) ? fmtMs(v) + " ms" : "–";
}

export function fmtFps(v) {
  if (!isNum(v)) return "–";
  return v < 100 ? v.toFixed(1) : v.toFixed(0);
}

export function fmtPct(r) {
  if (!isNum(r)) return "–";
  if (r === 0) return "0%";
  var p = r * 100;
  if (p < 0.01) return "<0.01%";
  if (p < 10) return p.toFixed(2) + "%";
  return p.toFixed(1) + "%";
}

export function fmtInt(n) {
  if (!isNum(n)) return "–";
  return Math.round(n).toLocaleString("en-US");
}

/** Colour class of a latency against its budget: ok, warn (over 80 %), bad (over budget). */
export function latClass(v, budget) {
  if (!isNum(v)) return "nodata";
  if (!isNum(budget) || budget <= 0) return "";
  if (v > budget) return "bad";
  if (v > 0.8 * budget) return "warn";
  return "ok";
}

export function missClass(r) {
  if (!isNum(r)) return "nodata";
  if (r > 0.05) return "bad";
  if (r > 0.01) return "warn";
  return "";
}
