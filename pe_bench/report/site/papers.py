"""The paper a scheme comes from, as its class's docstring cites it, e.g. "Attention with
linear biases (Press et al. 2022, https://arxiv.org/abs/2108.12409)".

The registry keeps no citation field: every scheme's docstring names its reference (the
convention of docs/add_your_encoding.md), so the site reads it from there, plugins included:
the first author and year in the docstrings of the class and its bases up to
``PositionScheme`` (a DAPE on ALiBi cites DAPE), else in its module's docstring, with the
first address of that docstring."""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass
from functools import cache

from pe_bench.positions import PositionScheme, registered
from pe_bench.report.site.html import LINK, e

# "Press et al. 2022", "Su 2021", "bloc97 and emozilla 2023", "Meta 2025"
AUTHOR_YEAR = re.compile(r"([A-Za-z][\w'-]*(?: et al\.| and [\w'-]+)?) ((?:199|20[0-3])\d)\b")


@dataclass(frozen=True)
class Citation:
    """Who and when (``text``: 'Press et al. 2022', '' when the docstrings name no year), the
    year, and the paper's address ('' when they give none)."""

    text: str = ""
    year: int | None = None
    url: str = ""

    def html(self) -> str:
        if not self.text:
            return "–"
        return f'<a href="{e(self.url)}">{e(self.text)}</a>' if self.url else e(self.text)


@cache
def citation(name: str) -> Citation:
    """The citation of the scheme registered as ``name`` (an empty one for a name that is not
    registered here: a pretrained model, a plugin not imported)."""
    cls = registered().get(name)
    if cls is None:
        return Citation()
    own = cls.__mro__[: cls.__mro__.index(PositionScheme)]
    docs = [inspect.cleandoc(c.__doc__ or "") for c in own]
    docs.append(inspect.cleandoc(sys.modules[cls.__module__].__doc__ or ""))
    for doc in docs:
        found = AUTHOR_YEAR.search(doc)
        if found:
            link = LINK.search(doc)
            url = link.group(1) if link else ""
            return Citation(f"{found.group(1)} {found.group(2)}", int(found.group(2)), url)
    return Citation()
