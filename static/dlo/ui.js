// Every page: the theme toggle, times in the viewer's zone, and the shortcut help (?).
// No inline scripts (CSP); everything is wired from data attributes and ids.
(function () {
  "use strict";
  var THEMES = ["auto", "light", "dark"];

  // 1. Theme: auto (the system setting) → light → dark, remembered in this browser.
  function currentTheme() {
    try { return window.localStorage.getItem("dlo-theme") || "auto"; } catch (e) { return "auto"; }
  }
  function applyTheme(theme) {
    var root = document.documentElement;
    if (theme === "light" || theme === "dark") { root.setAttribute("data-theme", theme); } else { root.removeAttribute("data-theme"); }
    var button = document.getElementById("theme-toggle");
    if (button) {
      button.textContent = "Theme: " + theme;
      button.setAttribute("aria-label", "Colour theme: " + theme + " (change)");
    }
  }
  function cycleTheme() {
    var next = THEMES[(THEMES.indexOf(currentTheme()) + 1) % THEMES.length];
    try {
      if (next === "auto") { window.localStorage.removeItem("dlo-theme"); } else { window.localStorage.setItem("dlo-theme", next); }
    } catch (e) { /* not remembered, still applied */ }
    applyTheme(next);
  }

  // 2. Times: <time data-local> carries UTC; show it in the viewer's zone, UTC on hover.
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  var zoneName = "";
  try {
    zoneName = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" })
      .formatToParts(new Date()).filter(function (p) { return p.type === "timeZoneName"; })[0].value;
  } catch (e) { zoneName = ""; }
  function localise(root) {
    (root || document).querySelectorAll("time[data-local]").forEach(function (el) {
      if (el.hasAttribute("data-localised")) { return; }
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime())) { return; }
      var date = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate());
      var hm = pad(d.getHours()) + ":" + pad(d.getMinutes());
      var style = el.getAttribute("data-local");
      var text = style === "date" ? date : style === "time" ? hm
        : style === "seconds" ? date + " " + hm + ":" + pad(d.getSeconds()) : date + " " + hm;
      el.textContent = text + (zoneName && style !== "date" ? " " + zoneName : "");
      el.setAttribute("data-localised", "");
    });
    // Chart hover titles: "HH:MM:SS UTC" becomes the viewer's time with UTC kept beside it;
    // data-t (and data-t2 for a span's end) carry the epoch seconds of each time in order.
    (root || document).querySelectorAll("svg [data-t] > title").forEach(function (title) {
      var el = title.parentNode;
      if (el.hasAttribute("data-localised")) { return; }
      var epochs = [el.getAttribute("data-t"), el.getAttribute("data-t2")];
      var i = 0;
      title.textContent = title.textContent.replace(/\d\d:\d\d:\d\d UTC/g, function (utc) {
        var d = new Date(Number(epochs[i++]) * 1000);
        if (isNaN(d.getTime())) { return utc; }
        var local = pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
        return local + (zoneName ? " " + zoneName : "") + " (" + utc + ")";
      });
      el.setAttribute("data-localised", "");
    });
  }

  // 3. Shortcut help: "?" (or the visible button) opens the dialog listing this page's keys.
  function toggleHelp() {
    var dialog = document.getElementById("shortcut-help");
    if (!dialog) { return; }
    if (dialog.open) { dialog.close(); } else { dialog.showModal(); }
  }
  function typing(e) {
    var t = e.target;
    return t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
  }
  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey || typing(e)) { return; }
    if (e.key === "?") { e.preventDefault(); toggleHelp(); }
  });

  document.addEventListener("click", function (e) {
    if (e.target.closest && e.target.closest("[data-help-open]")) { toggleHelp(); }
  });
  document.addEventListener("DOMContentLoaded", function () {
    applyTheme(currentTheme());
    var button = document.getElementById("theme-toggle");
    if (button) { button.hidden = false; button.addEventListener("click", cycleTheme); }
    localise(document);
  });
  document.addEventListener("htmx:load", function (e) { localise(e.target); });
  window.dloLocalise = localise;
})();
