"""``pe-bench-report <folder> --site <dir>``: a report as a static leaderboard site.

The site is a folder of HTML pages with one stylesheet and one script beside them
(``static/``): it opens from the file system (``file://``) or any static host, and loads
nothing from the network. The numbers come from the report's tables (``report.build``), the
figures are inline SVG drawn here (``svg.py``) and ``site.js`` (vanilla JavaScript, no
library) adds sorting, filtering, search, the "not separated" marks, compact mode, the column
chooser, headers that stay in view and hover values.

- ``pages.py``: the index (leaderboard, curves, cost, passkey, scheme list, provenance) and
  ``write_site``;
- ``tasks.py``: the index of a synthetic-task report;
- ``scale.py``: the scale view, the index of a scale ladder's report;
- ``boards.py``: a metric's table and curves, and what the site knows of each label;
- ``schemes.py``: a page per scheme; ``costs.py``: the cost tables; ``papers.py``: the
  paper column, from each scheme's docstring;
- ``html.py``, ``svg.py``: HTML and SVG building blocks.
"""

from pe_bench.report.site.pages import write_site

__all__ = ["write_site"]
