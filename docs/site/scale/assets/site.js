// pe-bench leaderboard: sorting, filtering, "not separated" marks and hover values for the
// pages pe-bench-report --site writes. Plain JavaScript, no library, nothing fetched: every
// number is already in the page (cells' data-v, inline JSON), so it works from file://.
(function () {
  "use strict";
  var filters = {};

  function value(cell) {
    var v = cell.getAttribute("data-v");
    return v === null || v === "" ? NaN : parseFloat(v);
  }

  function boardData(table) {
    var node = document.getElementById("pairs-" + table.getAttribute("data-board"));
    return node ? JSON.parse(node.textContent) : null;
  }

  // Sorting: the first click sorts best first (data-best), the next reverses; missing last.
  function sortBy(table, index, th) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var kind = th.getAttribute("data-sort");
    var bestFirst = th.getAttribute("data-best") === "high" ? -1 : 1;
    var asc = th.getAttribute("aria-sort");
    var dir = asc === null || asc === "none" ? bestFirst : -dirOf(asc);
    rows.sort(function (a, b) {
      var x = a.cells[index], y = b.cells[index];
      if (kind === "text") {
        return dir * x.getAttribute("data-v").localeCompare(y.getAttribute("data-v"));
      }
      var p = value(x), q = value(y);
      if (isNaN(p) || isNaN(q)) { return isNaN(p) - isNaN(q); }
      return dir * (p - q);
    });
    Array.prototype.forEach.call(th.parentNode.cells, function (h) { h.setAttribute("aria-sort", "none"); });
    th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
    rows.forEach(function (r) { body.appendChild(r); });
  }

  function dirOf(sort) { return sort === "ascending" ? 1 : -1; }

  // Marks: per length column, the best of the rows shown (or the reference row) in bold, the
  // rows the seeds do not separate from it marked "tied".
  function mark(table) {
    var data = boardData(table);
    if (!data) { return; }
    var heads = table.tHead.rows[0].cells;
    var all = Array.prototype.slice.call(table.tBodies[0].rows);
    var rows = all.filter(function (r) { return !r.hidden; });
    Array.prototype.forEach.call(heads, function (th, i) {
      var length = th.getAttribute("data-len");
      if (length === null) { return; }
      all.forEach(function (r) { r.cells[i].classList.remove("best", "tied"); });
      var ties = data.ties[length] || [];
      var best = null, top = NaN;
      rows.forEach(function (r) {
        var v = value(r.cells[i]);
        var label = r.getAttribute("data-label");
        if (filters.ref) {
          if (label === filters.ref && !isNaN(v)) { best = [label]; top = v; }
          return;
        }
        if (isNaN(v)) { return; }
        if (isNaN(top) || (data.higher ? v > top : v < top)) { top = v; best = [label]; }
        else if (v === top) { best.push(label); }
      });
      var same = best && best.length === rows.length && rows.length > 1 && !filters.ref;
      var near = {};
      (best || []).forEach(function (b) {
        (ties[data.labels.indexOf(b)] || []).forEach(function (j) { near[data.labels[j]] = true; });
      });
      rows.forEach(function (r) {
        var cell = r.cells[i], label = r.getAttribute("data-label");
        if (!best || same || isNaN(value(cell))) { return; }
        if (best.indexOf(label) >= 0) { cell.classList.add("best"); }
        else if (near[label]) { cell.classList.add("tied"); }
      });
    });
  }

  function matches(row) {
    return (!filters.family || row.getAttribute("data-family") === filters.family) &&
      (!filters.kind || row.getAttribute("data-kind") === filters.kind);
  }

  // Filters: rows of every table, columns of other lengths, the curves of the labels hidden.
  function apply() {
    var shown = {};
    document.querySelectorAll("table.board").forEach(function (table) {
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        var label = row.getAttribute("data-label");
        row.hidden = !matches(row);
        if (!row.hidden) { shown[label] = true; }
      });
      table.querySelectorAll("[data-len]").forEach(function (cell) {
        cell.hidden = Boolean(filters.length) && cell.getAttribute("data-len") !== filters.length;
      });
      mark(table);
    });
    document.querySelectorAll("figure.panel").forEach(function (panel) {
      var any = false;
      panel.querySelectorAll("[data-label]").forEach(function (node) {
        var label = node.getAttribute("data-label");
        var hide = !(label in shown);
        if (node.tagName.toLowerCase() === "g") { node.style.display = hide ? "none" : ""; }
        else { node.hidden = hide; }
        any = any || !hide;
      });
      panel.hidden = !any;
    });
  }

  // Hover: a point shows its label and value; a line or legend entry brings its label forward.
  var tip = document.getElementById("tip");
  function focus(svg, label) {
    svg.classList.toggle("focus", label !== null);
    svg.querySelectorAll("g.series").forEach(function (g) {
      g.classList.toggle("hot", g.getAttribute("data-label") === label);
    });
  }

  document.querySelectorAll("svg.curve").forEach(function (svg) {
    svg.addEventListener("mouseover", function (event) {
      var g = event.target.closest("g.series");
      focus(svg, g ? g.getAttribute("data-label") : null);
      if (event.target.classList.contains("pt")) {
        tip.textContent = event.target.getAttribute("data-tip");
        tip.hidden = false;
        var box = event.target.getBoundingClientRect();
        tip.style.left = window.scrollX + box.right + 8 + "px";
        tip.style.top = window.scrollY + box.top - 8 + "px";
      }
    });
    svg.addEventListener("mouseout", function (event) {
      if (event.target.classList.contains("pt")) { tip.hidden = true; }
      if (!svg.contains(event.relatedTarget)) { focus(svg, null); }
    });
  });

  document.querySelectorAll("ul.legend li").forEach(function (item) {
    var svg = item.closest("figure").querySelector("svg.curve");
    item.addEventListener("mouseenter", function () { focus(svg, item.getAttribute("data-label")); });
    item.addEventListener("mouseleave", function () { focus(svg, null); });
  });

  document.querySelectorAll("table.board th[data-sort]").forEach(function (th) {
    var table = th.closest("table");
    var go = function () { sortBy(table, th.cellIndex, th); };
    th.addEventListener("click", go);
    th.addEventListener("keydown", function (event) {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); go(); }
    });
  });

  document.querySelectorAll("select[data-filter]").forEach(function (select) {
    select.addEventListener("change", function () {
      filters[select.getAttribute("data-filter")] = select.value;
      apply();
    });
    filters[select.getAttribute("data-filter")] = select.value;
  });
  apply();
})();
