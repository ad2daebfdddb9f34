/* The stages of a frame: their colours, their order, and the bar of each stage's share of the p50s.
 *
 * The stage names come from the server (`stage_names` in a snapshot or device page, in pipeline
 * order; `stages` keyed by name); only their colours live here, and a stage this table does not
 * know yet still gets one. */

import { clear, el } from "./dom.js";
import { fmtMs, fmtMsUnit, isNum } from "./format.js";

var STAGE_COLORS = {
  capture_wait: "#94a3b8",
  preprocess: "#2bb3a3",
  inference: "#4f7cff",
  postprocess: "#a673f5",
  sink: "#e0a53a",
};
var EXTRA_COLORS = ["#d9628e", "#6fbf4a", "#c28a5a", "#5aa9d9"];

export function stageColor(name, i) {
  return STAGE_COLORS[name] || EXTRA_COLORS[i % EXTRA_COLORS.length];
}

/** The stages `stages` has data for: those of `order` (the server's stage_names) first, then any other. */
export function stageNames(stages, order) {
  if (!stages) return [];
  var names = (order || []).filter(function (s) {
    return stages[s] || (stages.totals && stages.totals[s]);
  });
  Object.keys(stages).forEach(function (k) {
    if (k !== "t" && k !== "totals" && names.indexOf(k) < 0 && stages[k] && typeof stages[k] === "object") {
      names.push(k);
    }
  });
  return names;
}

/** One bar split by each stage's share of the summed p50s, with p50/p99 per stage. */
export function renderStageBars(node, stages, order) {
  clear(node);
  var totals = (stages && stages.totals) || {};
  var names = stageNames(stages, order).filter(function (s) {
    return totals[s];
  });
  if (!names.length) return;
  var sum = names.reduce(function (acc, s) {
    return acc + (isNum(totals[s].p50) ? totals[s].p50 : 0);
  }, 0);
  var bar = el("div", { class: "stage-bar", role: "img", "aria-label": "share of p50 per stage" });
  var keys = el("div", { class: "stage-keys" });
  names.forEach(function (s, i) {
    var v = totals[s];
    var color = stageColor(s, i);
    if (sum > 0 && isNum(v.p50)) {
      var seg = el("span");
      seg.style.width = ((100 * v.p50) / sum).toFixed(2) + "%";
      seg.style.background = color;
      seg.title = s + " p50 " + fmtMsUnit(v.p50);
      bar.appendChild(seg);
    }
    var k = el("span");
    var sw = el("i");
    sw.style.background = color;
    k.appendChild(sw);
    k.appendChild(document.createTextNode(s + " "));
    k.appendChild(el("b", null, fmtMs(v.p50)));
    k.appendChild(document.createTextNode(" / " + fmtMs(v.p99) + " ms"));
    keys.appendChild(k);
  });
  node.appendChild(bar);
  node.appendChild(keys);
  var hint = el("div", { class: "stage-keys" }, "p50 / p99 over the window");
  node.appendChild(hint);
}
