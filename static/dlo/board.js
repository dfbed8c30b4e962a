// Health board: live updates (rows pushed over the websocket, swapped by htmx), their
// notices, acknowledgements and status, the polling fallback, the ages of the last samples,
// and the keyboard path (j/k). No inline scripts (CSP).
(function () {
  "use strict";
  var POLL_MS = 15000;
  var timer = null;
  var lostTimer = null;
  var stopped = false;
  var LOST_TEXT = "Live updates lost — refreshing every 15 s.";

  function board() { return document.getElementById("board"); }
  function refresh() {
    var b = board();
    if (b && window.htmx) { window.htmx.trigger(b, "dlo:refresh"); }
  }
  function banner(show, text) {
    var el = document.getElementById("live-lost");
    if (!el) { return; }
    if (text) { el.textContent = text; }
    el.hidden = !show;
  }
  function startPolling(text) {
    banner(true, text || (stopped ? null : LOST_TEXT));
    if (timer) { return; }
    timer = setInterval(refresh, POLL_MS);
  }
  function stopPolling() {
    if (lostTimer) { clearTimeout(lostTimer); lostTimer = null; }
    var wasPolling = timer !== null;
    if (timer) { clearInterval(timer); timer = null; }
    banner(false);
    return wasPolling;
  }
  // The server stopped this page's live updates (a send failed): say so, reload the rows now
  // (the reloaded board opens a new socket) and keep refreshing until live updates are back.
  function liveStopped(reason) {
    if (stopped) { return; }
    stopped = true;
    var at = new Date().toLocaleTimeString();
    startPolling("Live updates stopped" + (reason ? " (" + reason + ")" : "") +
      ". Rows reloaded at " + at + "; refreshing every 15 s until they are back.");
    refresh();
  }
  document.addEventListener("htmx:wsOpen", function (e) {
    e.target.__dloOpen = true;
    stopped = false;
    unacked = 0;  // a new socket: the server counts from nothing in flight
    unackedBytes = 0;
    // Back live: catch up on what changed while the socket was down, then stop polling.
    if (stopPolling()) { refresh(); }
  });
  function lost() {
    // A filter change also closes the old socket for a moment: wait before declaring it lost.
    if (lostTimer || timer) { return; }
    lostTimer = setTimeout(function () {
      lostTimer = null;
      var b = board();
      if (!b || !b.__dloOpen) { startPolling(); }
    }, 3000);
  }
  document.addEventListener("htmx:wsClose", function (e) {
    e.target.__dloOpen = false;
    var code = e.detail && e.detail.event && e.detail.event.code;
    if (code === 4500) { liveStopped(""); return; }  // stopped, its notice lost
    lost();
  });
  document.addEventListener("htmx:wsError", function (e) { e.target.__dloOpen = false; lost(); });

  // Messages: rows (HTML, swapped by htmx; row patches and a broker's sample time may be in
  // the same message as comments, <!--dlo {...}-->, read after the swap) or a notice (JSON, handled here). They are
  // acknowledged once handled, in batches ("ack N": N more messages): at once past ACK_BYTES,
  // else as soon as the page is idle. The server keeps a bounded window unacknowledged.
  var ACK_BYTES = 256 * 1024;
  var unacked = 0;
  var unackedBytes = 0;
  var ackTimer = null;
  var ackSocket = null;
  function sendAck() {
    if (ackTimer) { clearTimeout(ackTimer); ackTimer = null; }
    if (unacked && ackSocket) { ackSocket.send("ack " + unacked); }
    unacked = 0;
    unackedBytes = 0;
  }
  function ack(detail, size) {
    if (!detail || !detail.socketWrapper) { return; }
    if (ackSocket !== detail.socketWrapper) { unacked = 0; unackedBytes = 0; }  // a new socket
    ackSocket = detail.socketWrapper;
    unacked += 1;
    unackedBytes += size;
    if (unackedBytes >= ACK_BYTES) { sendAck(); } else if (!ackTimer) { ackTimer = setTimeout(sendAck, 0); }
  }
  // A row patch: [channel id, {cell index: inner HTML}, from version, to version] for the
  // cells whose meaning changed (the state's evidence line, numbers, sparkline, drain ETA,
  // sample; never the channel cell, and a new state or flag comes as a whole row). The HTML is
  // the server's, escaped as in a whole row. It applies only to the row at the version it
  // starts from (the row's data-v, rendered by the server in the page and in every pushed
  // row); a row at another version is asked for whole ("rows N,M"). A row this page has not
  // loaded (a slice not shown yet) is skipped, as htmx skips a whole row it cannot place; its
  // state did not change, so it needs no attention.
  var ROWS_ASKED_MAX = 2000;
  var wanted = [];
  function patchRow(p) {
    if (!Array.isArray(p) || !p[1] || typeof p[1] !== "object") { return; }
    var id = Number(p[0]);
    var tr = document.getElementById("ch-" + id);
    if (!tr || !board() || !board().contains(tr)) { return; }
    if (typeof p[2] !== "string" || typeof p[3] !== "string" || tr.getAttribute("data-v") !== p[2]) {
      if (wanted.indexOf(id) < 0) { wanted.push(id); }
      return;
    }
    Object.keys(p[1]).forEach(function (i) {
      var td = tr.cells[Number(i)];
      if (td && Number(i) >= 1 && typeof p[1][i] === "string") { td.innerHTML = p[1][i]; }
    });
    tr.setAttribute("data-v", p[3]);
  }
  function askRows(detail) {
    var socket = detail && detail.socketWrapper;
    while (socket && wanted.length) { socket.send("rows " + wanted.splice(0, ROWS_ASKED_MAX).join(",")); }
    wanted = [];
  }
  function notice(data) {
    if (data.patch) { patchRow(data.patch); }
    if (data.sampled) { sampled(data.sampled.broker, data.sampled.at); }
    if (data.reload) { refresh(); }
    if (data.stopped) { liveStopped(data.stopped.reason); }
  }
  var FOLDED = /<!--dlo (\{[^<>]*\})-->/g;
  function foldedNotices(message) {
    if (message.indexOf("<!--dlo ") < 0) { return; }
    var m;
    FOLDED.lastIndex = 0;
    while ((m = FOLDED.exec(message)) !== null) {
      try { notice(JSON.parse(m[1])); } catch (err) { /* not a notice */ }
    }
  }
  var kept = null;
  document.addEventListener("htmx:wsBeforeMessage", function (e) {
    var message = e.detail && e.detail.message;
    if (typeof message === "string" && message.charAt(0) === "{") {
      e.preventDefault();
      try { notice(JSON.parse(message)); } finally { ack(e.detail, message.length); askRows(e.detail); }
      return;
    }
    kept = keep();
  });
  document.addEventListener("htmx:wsAfterMessage", function (e) {
    var message = (e.detail && e.detail.message) || "";
    try {
      if (typeof message === "string") { foldedNotices(message); }
      restore(kept);
    } finally { kept = null; ack(e.detail, message.length || 0); askRows(e.detail); }
  });

  // Focus, scroll and the j/k row survive a pushed row replacing the one they were on.
  function rowOf(el) {
    var tr = el && el.closest ? el.closest("tr[id^='ch-']") : null;
    return tr && board() && board().contains(tr) ? tr : null;
  }
  function focusables(tr) { return tr.querySelectorAll("a[href], button, input, select, textarea, [tabindex]"); }
  function keep() {
    var active = document.activeElement;
    var tr = rowOf(active);
    var index = tr ? Array.prototype.indexOf.call(focusables(tr), active) : -1;
    return { row: tr ? tr.id : null, index: index, active: active, x: window.scrollX, y: window.scrollY };
  }
  function restore(state) {
    markCurrent(false);
    ages();
    if (!state) { return; }
    if (state.row && document.activeElement !== state.active) {
      var tr = document.getElementById(state.row);
      var targets = tr ? focusables(tr) : [];
      var target = targets[state.index] || targets[0];
      if (target) { target.focus({ preventScroll: true }); }
    }
    if (window.scrollX !== state.x || window.scrollY !== state.y) { window.scrollTo(state.x, state.y); }
  }

  // j/k: the next/previous row of the board, focused on its channel link (Enter opens it).
  var currentId = null;
  function rows() { return Array.prototype.slice.call(document.querySelectorAll("#board-rows > tr[id^='ch-']")); }
  function markCurrent(focus) {
    rows().forEach(function (tr) { tr.classList.toggle("is-current", tr.id === currentId); });
    var tr = currentId && document.getElementById(currentId);
    var link = tr && tr.querySelector("a[href]");
    if (focus && link) { link.focus(); }
  }
  function move(step) {
    var all = rows();
    if (!all.length) { return; }
    var at = -1;
    for (var i = 0; i < all.length; i++) { if (all[i].id === currentId) { at = i; } }
    if (at < 0) {
      var own = rowOf(document.activeElement);
      at = own ? all.indexOf(own) : -1;
    }
    var next = at < 0 ? 0 : Math.max(0, Math.min(all.length - 1, at + step));
    currentId = all[next].id;
    markCurrent(true);
  }
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey) { return; }
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) { return; }
    if (document.querySelector("dialog[open]") || !document.getElementById("board-rows")) { return; }
    if (e.key === "j") { e.preventDefault(); move(1); } else if (e.key === "k") { e.preventDefault(); move(-1); }
  });
  // A reload of the whole board (polling, a notice) keeps them too.
  var keptOnReload = null;
  document.addEventListener("htmx:beforeSwap", function (e) {
    var target = e.detail && e.detail.target;
    if (target && target.id === "board") { keptOnReload = keep(); }
  });
  document.addEventListener("htmx:afterSettle", function () {
    var state = keptOnReload;
    keptOnReload = null;
    restore(state);
  });

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

  // The age of each row's last sample, from its timestamp (the server renders the clock time,
  // true without JavaScript); a poll's "sampled" notice moves the time of its broker's rows.
  function fmt(seconds) {
    if (seconds < 90) { return Math.max(0, Math.round(seconds)) + " s"; }
    if (seconds < 5400) { return Math.round(seconds / 60) + " min"; }
    if (seconds < 172800) { return (seconds / 3600).toFixed(1) + " h"; }
    return (seconds / 86400).toFixed(1) + " d";
  }
  function ages() {
    var now = Date.now();
    document.querySelectorAll("time[data-age]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (isNaN(at)) { return; }
      el.textContent = fmt((now - at) / 1000) + " ago";
      el.title = new Date(at).toLocaleString();
    });
  }
  function sampled(broker, at) {
    var when = Date.parse(at);
    if (isNaN(when)) { return; }
    document.querySelectorAll("time[data-age][data-broker='" + Number(broker) + "']").forEach(function (el) {
      var was = Date.parse(el.getAttribute("datetime"));
      if (isNaN(was) || was < when) { el.setAttribute("datetime", at); }
    });
    ages();
  }
  ages();
  setInterval(ages, 5000);
})();
