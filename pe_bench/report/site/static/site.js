// pe-bench leaderboard: sorting, filtering, searching, "not separated" marks, compact mode,
// the column chooser, headers that stay in view and hover values for the pages
// pe-bench-report --site writes. Plain JavaScript, no library, nothing fetched: every number
// is already in the page (cells' data-v, inline JSON), so it works from file://.
(function () {
  "use strict";
  var filters = {};
  var hiddenColumns = {};

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

  // Marks: per marked column (a length, the score, the MRR), the best of the rows shown (or
  // the reference row) in bold, the rows the seeds do not separate from it marked "tied".
  function mark(table) {
    var data = boardData(table);
    if (!data) { return; }
    var heads = table.tHead.rows[0].cells;
    var all = Array.prototype.slice.call(table.tBodies[0].rows);
    var rows = all.filter(function (r) { return !r.hidden; });
    Array.prototype.forEach.call(heads, function (th, i) {
      var key = th.getAttribute("data-mark");
      if (key === null) { return; }
      var higher = th.getAttribute("data-best") === "high";
      all.forEach(function (r) { r.cells[i].classList.remove("best", "tied"); });
      var ties = data.ties[key] || [];
      var best = null, top = NaN;
      rows.forEach(function (r) {
        var v = value(r.cells[i]);
        var label = r.getAttribute("data-label");
        if (filters.ref) {
          if (label === filters.ref && !isNaN(v)) { best = [label]; top = v; }
          return;
        }
        if (isNaN(v)) { return; }
        if (isNaN(top) || (higher ? v > top : v < top)) { top = v; best = [label]; }
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
    var text = (row.getAttribute("data-label") + " " + row.getAttribute("data-family")).toLowerCase();
    return (!filters.family || row.getAttribute("data-family") === filters.family) &&
      (!filters.kind || row.getAttribute("data-kind") === filters.kind) &&
      (!filters.q || text.indexOf(filters.q) >= 0);
  }

  // A column is hidden by the length filter (its multiple of the training length, data-x) or
  // by the column chooser (data-col).
  function columnHidden(cell) {
    var x = cell.getAttribute("data-x"), col = cell.getAttribute("data-col");
    return (Boolean(filters.length) && x !== null && x !== filters.length) ||
      (col !== null && hiddenColumns[col] === true);
  }

  // Filters: rows of every table, columns, the curves of the labels hidden.
  function apply() {
    var shown = {};
    document.querySelectorAll("table.board").forEach(function (table) {
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        var label = row.getAttribute("data-label");
        if (label === null) { return; }
        row.hidden = !matches(row);
        if (!row.hidden) { shown[label] = true; }
      });
      table.querySelectorAll("[data-x], [data-col]").forEach(function (cell) {
        cell.hidden = columnHidden(cell);
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
    stick();
  }

  // Headers in view: while a table scrolls past the top of the window (below the filter bar,
  // which stays there), its header row is moved down with it. CSS alone cannot: a table that
  // scrolls sideways in its own box is a scroll container, and position: sticky then sticks
  // to that box, not to the window.
  var bar = document.querySelector("form.filters");
  function stick() {
    var top = bar ? Math.max(0, bar.getBoundingClientRect().bottom) : 0;
    document.querySelectorAll("table.board").forEach(function (table) {
      var head = table.tHead, cells = head ? head.rows[0].cells : [];
      if (!cells.length) { return; }
      var body = table.tBodies[0].getBoundingClientRect();  // the header's moves leave it be
      var height = head.getBoundingClientRect().height;
      var natural = body.top - height;
      var next = Math.max(0, Math.min(top - natural, body.height - height));
      var shift = table._shift || 0;
      if (next === shift) { return; }
      table._shift = next;
      table.classList.toggle("stuck", next > 0);
      Array.prototype.forEach.call(cells, function (th) {
        th.style.transform = next ? "translateY(" + next + "px)" : "";
      });
    });
  }
  var pending = false;
  function onScroll() {
    if (pending) { return; }
    pending = true;
    window.requestAnimationFrame(function () { pending = false; stick(); });
  }
  window.addEventListener("scroll", onScroll, { passive: true });
  window.addEventListener("resize", onScroll);

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

  var search = document.querySelector('input[data-filter="q"]');
  if (search) {
    var find = function () { filters.q = search.value.trim().toLowerCase(); apply(); };
    search.addEventListener("input", find);
    filters.q = search.value.trim().toLowerCase();
  }

  // Compact mode: the means only (intervals, family and kind hidden), tighter cells.
  var compact = document.querySelector('input[data-view="compact"]');
  if (compact) {
    var view = function () { document.body.classList.toggle("compact", compact.checked); stick(); };
    compact.addEventListener("change", view);
    view();
  }

  // The column chooser: a box per column the tables name (data-col), in page order.
  var choices = document.querySelector("details.columns .choices");
  if (choices) {
    var seen = {};
    document.querySelectorAll("table.board th[data-col]").forEach(function (th) {
      var key = th.getAttribute("data-col");
      if (seen[key]) { return; }
      seen[key] = true;
      var label = document.createElement("label");
      var box = document.createElement("input");
      box.type = "checkbox";
      box.checked = true;
      box.setAttribute("data-col", key);
      box.addEventListener("change", function () { hiddenColumns[key] = !box.checked; apply(); });
      label.appendChild(box);
      label.appendChild(document.createTextNode(" " + th.textContent));
      choices.appendChild(label);
    });
    if (!choices.childNodes.length) { choices.closest("details").hidden = true; }
  }
  apply();
})();
