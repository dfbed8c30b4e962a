// The dead-letter list's keyboard path: j/k move, x selects, r/d act on the selection, / searches
// (? for help is in ui.js). Each key has a visible button with the same data-key, so nothing is
// keyboard-only or mouse-only. Rows are re-read on every key: htmx swaps #results on filtering.
(function () {
  "use strict";
  var current = -1;

  function rows() { return Array.prototype.slice.call(document.querySelectorAll("table.dlq-entries tbody tr")); }
  function mark(index) {
    var all = rows();
    if (!all.length) { return; }
    current = Math.max(0, Math.min(all.length - 1, index));
    all.forEach(function (tr, i) { tr.classList.toggle("is-current", i === current); });
    var link = all[current].querySelector("a");
    if (link) { link.focus(); }
  }
  function toggleCurrent() {
    var tr = rows()[current];
    var box = tr && tr.querySelector("input[type=checkbox][name=id]");
    if (box) { box.checked = !box.checked; syncAll(); }
  }
  function act(key) {
    var button = document.querySelector("#bulk button[data-key='" + key + "']");
    if (!button) { return; }
    if (!document.querySelector("input[type=checkbox][name=id]:checked")) {
      var tr = rows()[current];  // nothing selected: act on the current entry
      var box = tr && tr.querySelector("input[type=checkbox][name=id]");
      if (!box) { return; }
      box.checked = true;
    }
    button.click();
  }
  function run(key) {
    if (key === "j") { mark(current + 1); } else if (key === "k") { mark(current < 0 ? 0 : current - 1); } else if (key === "x") { if (current < 0) { mark(0); } toggleCurrent(); } else if (key === "r" || key === "d") { act(key); } else if (key === "/") {
      var search = document.querySelector("input[name=q]");
      if (search) { search.focus(); search.select(); }
    }
  }
  function syncAll() {
    var all = document.getElementById("select-all");
    if (!all) { return; }
    var boxes = document.querySelectorAll("input[type=checkbox][name=id]");
    var checked = document.querySelectorAll("input[type=checkbox][name=id]:checked");
    all.checked = boxes.length > 0 && checked.length === boxes.length;
    all.indeterminate = checked.length > 0 && checked.length < boxes.length;
  }
  function wire(root) {
    var bar = document.getElementById("triage-keys");
    if (bar) {
      bar.hidden = false;
      bar.querySelectorAll("[data-help-open]").forEach(function (b) { b.hidden = false; });
    }
    var all = document.getElementById("select-all");
    if (all && !all.__dlo) {
      all.__dlo = true;
      all.hidden = false;
      all.addEventListener("change", function () {
        document.querySelectorAll("input[type=checkbox][name=id]").forEach(function (b) { b.checked = all.checked; });
      });
    }
    current = -1;
  }
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("#triage-keys button[data-key]");
    if (button) { run(button.getAttribute("data-key")); }
  });
  document.addEventListener("change", function (e) {
    if (e.target && e.target.name === "id") { syncAll(); }
  });
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey) { return; }
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) {
      if (e.key === "Escape") { t.blur(); }
      return;
    }
    if (document.querySelector("dialog[open]")) { return; }
    if (["j", "k", "x", "r", "d", "/"].indexOf(e.key) >= 0) { e.preventDefault(); run(e.key); }
  });
  document.addEventListener("DOMContentLoaded", function () { wire(document); });
  document.addEventListener("htmx:afterSettle", function () { wire(document); });
})();
