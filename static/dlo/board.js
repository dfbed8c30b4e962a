// Health board: live-update status and the polling fallback. No inline scripts (CSP).
(function () {
  "use strict";
  var POLL_MS = 15000;
  var timer = null;
  var lostTimer = null;

  function banner(show) {
    var el = document.getElementById("live-lost");
    if (el) { el.hidden = !show; }
  }
  function startPolling() {
    banner(true);
    if (timer) { return; }
    timer = setInterval(function () {
      var board = document.getElementById("board");
      if (board && window.htmx) { window.htmx.trigger(board, "dlo:refresh"); }
    }, POLL_MS);
  }
  function stopPolling() {
    if (lostTimer) { clearTimeout(lostTimer); lostTimer = null; }
    var wasPolling = timer !== null;
    if (timer) { clearInterval(timer); timer = null; }
    banner(false);
    return wasPolling;
  }
  document.addEventListener("htmx:wsOpen", function () {
    // Back live: catch up on what changed while the socket was down, then stop polling.
    if (stopPolling()) {
      var board = document.getElementById("board");
      if (board && window.htmx) { window.htmx.trigger(board, "dlo:refresh"); }
    }
  });
  function lost() {
    // A filter change also closes the old socket for a moment: wait before declaring it lost.
    if (lostTimer || timer) { return; }
    lostTimer = setTimeout(function () {
      lostTimer = null;
      var board = document.getElementById("board");
      if (!board || !board.__dloOpen) { startPolling(); }
    }, 3000);
  }
  document.addEventListener("htmx:wsOpen", function (e) { e.target.__dloOpen = true; });
  document.addEventListener("htmx:wsClose", function (e) { e.target.__dloOpen = false; lost(); });
  document.addEventListener("htmx:wsError", function (e) { e.target.__dloOpen = false; lost(); });

  // A big board loads its rows in slices (the "more" row). A pushed row that is not loaded
  // yet is dropped by htmx, unless it needs attention: then it goes above the unloaded part,
  // so no unhealthy channel stays out of sight. A slice loaded later replaces any copy.
  document.body.addEventListener("htmx:oobErrorNoTarget", function (e) {
    var row = e.detail && e.detail.content;
    var more = document.getElementById("board-more");
    if (!row || !more || !/^ch-\d+$/.test(row.id || "")) { return; }
    if (/\brow-(ok|idle)\b/.test(row.className) && !row.querySelector(".state[class*='state-dlq']")) { return; }
    row.removeAttribute("hx-swap-oob");
    more.parentNode.insertBefore(row, more);
  });
  document.body.addEventListener("htmx:beforeSwap", function (e) {
    var target = e.detail && e.detail.target;
    if (!target || target.id !== "board-more") { return; }
    var incoming = new DOMParser().parseFromString(
      "<table><tbody>" + e.detail.serverResponse + "</tbody></table>", "text/html");
    incoming.querySelectorAll("tr[id^='ch-']").forEach(function (tr) {
      var old = document.getElementById(tr.id);
      if (old) { old.remove(); }
    });
  });

  // Screen readers: a pushed row whose state changed is announced in the polite live region,
  // batched (at most one message every ANNOUNCE_MS, three channels named) so a busy board
  // does not flood; numbers that move without a state change are not announced.
  var ANNOUNCE_MS = 10000;
  var previous = {};
  var changed = {};
  var announceTimer = null;
  var lastAnnounced = 0;
  function stateText(row) {
    if (!row) { return ""; }
    return Array.prototype.map.call(row.querySelectorAll("td:nth-child(2) .state"), function (s) {
      return s.textContent.trim();
    }).join(", ");
  }
  function announce() {
    announceTimer = null;
    lastAnnounced = Date.now();
    var ids = Object.keys(changed);
    changed = {};
    var lines = [];
    ids.forEach(function (id) {
      var row = document.getElementById(id);
      var now = stateText(row);
      if (!row || now === previous[id]) { return; }
      var name = row.querySelector("td a");
      lines.push((name ? name.textContent.trim() : "A channel") + " is now " + now);
    });
    var region = document.getElementById("board-announce");
    if (!region || !lines.length) { return; }
    var text = lines.slice(0, 3).join(". ") + ".";
    if (lines.length > 3) { text += " " + (lines.length - 3) + " more channels changed state."; }
    region.textContent = text;
  }
  document.body.addEventListener("htmx:oobBeforeSwap", function (e) {
    var target = e.detail && e.detail.target;
    if (!target || !/^ch-\d+$/.test(target.id || "")) { return; }
    if (!(target.id in changed)) { previous[target.id] = stateText(target); }
    changed[target.id] = true;
    if (!announceTimer) {
      var wait = Math.max(2000, ANNOUNCE_MS - (Date.now() - lastAnnounced));
      announceTimer = setTimeout(announce, wait);
    }
  });

  function fmt(seconds) {
    if (seconds < 90) { return Math.max(0, Math.round(seconds)) + " s"; }
    if (seconds < 5400) { return Math.round(seconds / 60) + " min"; }
    if (seconds < 172800) { return (seconds / 3600).toFixed(1) + " h"; }
    return (seconds / 86400).toFixed(1) + " d";
  }
  setInterval(function () {
    var now = Date.now();
    document.querySelectorAll("time[data-age]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(at)) { el.textContent = fmt((now - at) / 1000) + " ago"; }
    });
  }, 5000);
})();
