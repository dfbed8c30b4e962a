// Runs in <head> before the page paints: the viewer's chosen theme (ui.js stores it), else the
// system setting (CSS prefers-color-scheme). No inline scripts (CSP).
(function () {
  "use strict";
  try {
    var theme = window.localStorage.getItem("dlo-theme");
    if (theme === "light" || theme === "dark") { document.documentElement.setAttribute("data-theme", theme); }
  } catch (e) { /* storage disabled: follow the system */ }
})();
