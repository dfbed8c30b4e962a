// The channel page's charts (issue 26.7): a crosshair with every series' value, by mouse,
// touch and keyboard, shared by the page's charts; drag across a chart to zoom (the range
// goes to the URL as ?from=&to=, which the server draws for every chart). The values come
// from each chart's own table (<details class="chart-table">), so nothing here computes them.
// No inline scripts (CSP): wired from classes and data attributes.
(function () {
  "use strict";
  var plots = Array.prototype.slice.call(document.querySelectorAll(".chart .plot"));
  if (!plots.length) { return; }
  var SVG = "http://www.w3.org/2000/svg";

  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function clock(t) {
    var d = new Date(t * 1000);
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  // 1. Each chart: its time span, its rows (time → cells) and a crosshair line in its SVG.
  var charts = plots.map(function (plot) {
    var figure = plot.closest("figure");
    var rows = Array.prototype.slice.call(figure.querySelectorAll(".chart-table tbody tr[data-t]"));
    var heads = Array.prototype.slice.call(figure.querySelectorAll(".chart-table thead th"))
      .slice(1).map(function (th) { return th.textContent; });
    var svg = plot.querySelector("svg");
    var line = document.createElementNS(SVG, "line");
    line.setAttribute("class", "crosshair");
    line.setAttribute("y1", "0");
    line.setAttribute("y2", svg.viewBox.baseVal.height);
    line.setAttribute("visibility", "hidden");
    svg.querySelector("g").appendChild(line);
    plot.setAttribute("tabindex", "0");
    plot.setAttribute("role", "group");
    plot.setAttribute("aria-label", figure.querySelector("figcaption").firstChild.textContent.trim() +
      ": use the left and right arrow keys to read the values");
    return {
      plot: plot, svg: svg, line: line, heads: heads,
      readout: figure.querySelector(".readout"),
      start: Number(plot.getAttribute("data-start")),
      end: Number(plot.getAttribute("data-end")),
      padX: Number(plot.getAttribute("data-pad")),
      width: Number(plot.getAttribute("data-width")),
      times: rows.map(function (tr) { return Number(tr.getAttribute("data-t")); }),
      cells: rows.map(function (tr) {
        return Array.prototype.slice.call(tr.querySelectorAll("td")).map(function (td) { return td.textContent; });
      })
    };
  });

  // 2. Showing a time on every chart: the row nearest to it, its values spoken.
  var current = null;
  function nearest(chart, t) {
    var best = -1;
    for (var i = 0; i < chart.times.length; i++) {
      if (best < 0 || Math.abs(chart.times[i] - t) < Math.abs(chart.times[best] - t)) { best = i; }
    }
    return best;
  }
  function show(t, source) {
    current = t;
    charts.forEach(function (chart) {
      // Only the chart in use speaks its values; the others follow silently.
      chart.readout.setAttribute("aria-live", chart === source ? "polite" : "off");
      var i = nearest(chart, t);
      if (i < 0) { chart.readout.textContent = ""; return; }
      var at = chart.times[i];
      var x = (at - chart.start) / Math.max(chart.end - chart.start, 1) * (chart.width - chart.padX);
      chart.line.setAttribute("x1", x.toFixed(1));
      chart.line.setAttribute("x2", x.toFixed(1));
      chart.line.setAttribute("visibility", "visible");
      chart.readout.textContent = clock(at) + " — " + chart.heads.map(function (h, k) {
        return h + " " + chart.cells[i][k];
      }).join(" · ");
    });
  }
  function timeAt(chart, clientX) {
    var box = chart.svg.getBoundingClientRect();
    var scale = box.width / chart.width;
    var x = (clientX - box.left) / scale - chart.padX;
    var fraction = Math.min(Math.max(x / (chart.width - chart.padX), 0), 1);
    return chart.start + fraction * (chart.end - chart.start);
  }

  // 3. Mouse and touch (pointer events), keyboard (arrows, Home, End), drag to zoom.
  charts.forEach(function (chart) {
    var dragFrom = null;
    chart.svg.addEventListener("pointermove", function (e) { show(timeAt(chart, e.clientX), chart); });
    chart.svg.addEventListener("pointerdown", function (e) {
      show(timeAt(chart, e.clientX), chart);
      dragFrom = e.pointerType === "mouse" ? e.clientX : null;
    });
    chart.svg.addEventListener("pointerup", function (e) {
      if (dragFrom === null || Math.abs(e.clientX - dragFrom) < 12) { dragFrom = null; return; }
      var a = timeAt(chart, dragFrom), b = timeAt(chart, e.clientX);
      dragFrom = null;
      var url = new URL(window.location.href);
      url.searchParams.delete("range");
      url.searchParams.set("from", String(Math.floor(Math.min(a, b))));
      url.searchParams.set("to", String(Math.ceil(Math.max(a, b))));
      url.hash = "charts";
      window.location.assign(url.toString());
    });
    chart.plot.addEventListener("focus", function () {
      if (current === null && chart.times.length) { show(chart.times[chart.times.length - 1], chart); }
    });
    chart.plot.addEventListener("keydown", function (e) {
      if (!chart.times.length) { return; }
      var i = current === null ? chart.times.length - 1 : nearest(chart, current);
      if (e.key === "ArrowLeft") { i = Math.max(i - 1, 0); }
      else if (e.key === "ArrowRight") { i = Math.min(i + 1, chart.times.length - 1); }
      else if (e.key === "Home") { i = 0; }
      else if (e.key === "End") { i = chart.times.length - 1; }
      else { return; }
      e.preventDefault();
      show(chart.times[i], chart);
    });
  });
})();
