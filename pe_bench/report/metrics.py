"""Every metric a report shows, one ``MetricSpec`` each, registered here and read by every table,
figure, LaTeX table and site page (as lm-evaluation-harness keeps one spec per metric).

A metric is a number each record carries under the metric's name, one per (run, eval length):
perplexity's (``LM``: the records of the nonoverlap, sliding and tail modes) or a synthetic
task's (``TASK``). Adding one is its spec plus the code that computes it::

    register(MetricSpec("ruler_acc", "RULER accuracy", "accuracy", "{:.2f}", kind=LM,
                        higher_is_better=True, bounds=(0.0, 1.0)))

and the run writes ``ruler_acc`` into its records. Wherever the records carry it, the report
then has its table (``tables/<name>.csv|.md|.tex``; a task's ``tables/<task>_<name>.*`` with its
pairwise differences and ranks), and ``pe-bench-report --metric <name>`` draws its figure, ratio
table and site leaderboard (a task metric's figure and site boards are drawn always). Nothing
else names it: the headings say ``title``, cells use ``fmt``, axes ``axis``, the best cell
is the highest or lowest by ``higher_is_better``, seeds pool by ``over_seeds``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from pe_bench.errors import UserError

LM = "lm"  # perplexity's records (modes nonoverlap, sliding, tail)
TASK = "task"  # a synthetic task's records (mode task)
MEAN = "mean"  # over seeds: the mean, with a t-interval
GEOMETRIC = "geometric"  # the mean of the logs mapped back (perplexity: exp of mean NLL)


@dataclass(frozen=True)
class MetricSpec:
    """How a report shows one metric (module docstring)."""

    name: str  # the records' field, and the tables' and figures' file names
    title: str  # headings and captions, e.g. "Perplexity"
    axis: str  # a figure's axis and the site's curves, e.g. "NLL (nats/token)"
    fmt: str = "{:.3f}"  # one value in a cell
    kind: str = LM  # which records carry it: LM or TASK
    higher_is_better: bool = False
    over_seeds: str = MEAN  # MEAN or GEOMETRIC
    bounds: tuple[float, float] | None = None  # a rate's interval is clipped to these
    log_axis: bool = False  # figures on a log scale
    paired_on: str = ""  # the metric whose paired differences separate labels ('': itself)
    per_token: bool = False  # not comparable across tokenizers (mixed ones: left out)
    required: bool = False  # every ok record of its kind carries it (else: optional)
    echo: bool = False  # printed on the console at the end of a run

    def __post_init__(self) -> None:
        if self.kind not in (LM, TASK) or self.over_seeds not in (MEAN, GEOMETRIC):
            raise ValueError(
                f"metric {self.name}: kind {self.kind!r}, over_seeds {self.over_seeds!r}"
            )

    @property
    def paired(self) -> str:
        """The metric whose paired differences over seeds say which labels are separated."""
        return self.paired_on or self.name


REGISTRY: dict[str, MetricSpec] = {}


def register(spec: MetricSpec) -> MetricSpec:
    """Add ``spec`` to the metrics every report shows; a name registered twice is an error."""
    if spec.name in REGISTRY:
        raise ValueError(f"metric {spec.name!r} is registered already")
    REGISTRY[spec.name] = spec
    return spec


def spec(name: str) -> MetricSpec:
    """The spec of metric ``name``, or a ``UserError`` naming the registered ones."""
    if name not in REGISTRY:
        raise UserError(f"metric {name!r} is not one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def of_kind(kind: str) -> list[MetricSpec]:
    """The registered metrics of ``kind`` (LM or TASK), in the order they were registered."""
    return [s for s in REGISTRY.values() if s.kind == kind]


def names(kind: str) -> list[str]:
    return [s.name for s in of_kind(kind)]


def present(kind: str, df: pd.DataFrame) -> list[MetricSpec]:
    """The metrics of ``kind`` that the records ``df`` carry (a number in one record at least)."""
    return [s for s in of_kind(kind) if s.name in df and df[s.name].notna().any()]


register(
    MetricSpec(
        "ppl",
        "Perplexity",
        "perplexity",
        "{:.2f}",
        over_seeds=GEOMETRIC,
        log_axis=True,
        paired_on="nll",
        per_token=True,
        required=True,
        echo=True,
    )
)
register(MetricSpec("bpb", "Bits per byte", "bits per byte", required=True, echo=True))
register(MetricSpec("nll", "NLL", "NLL (nats/token)", per_token=True, required=True))
register(
    MetricSpec(
        "exact_match",
        "Exact match",
        "exact match",
        "{:.2f}",
        kind=TASK,
        higher_is_better=True,
        bounds=(0.0, 1.0),
        required=True,
    )
)
register(
    MetricSpec(
        "token_acc",
        "Token accuracy",
        "token accuracy",
        "{:.2f}",
        kind=TASK,
        higher_is_better=True,
        bounds=(0.0, 1.0),
        required=True,
    )
)
