"""The claims the README draws from the quick suite, each a test a rung of a scale ladder can
pass or fail (``ladder``): so that the report says at which model sizes and training lengths
each sentence holds, instead of the reader assuming it holds at all of them.

Every test reads NLL paired over seeds: a difference counts only where its 95% t-interval
excludes 0 ("separated", as the one-protocol report's ranks). Where a sentence has no sharp
meaning ("break", "flat") the threshold is written in the claim itself. A rung that lacks a
label the claim names, or has fewer than 2 seeds, cannot test it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from pe_bench.report.rungs import RungResult
from pe_bench.stats import t_interval

FACTORS = (1, 2, 4, 8, 16)
BREAK_RATIO = 1.5  # "breaks": perplexity at 2x at least 1.5x that at 1x (and separated)
FLAT_RATIO = 1.05  # "flat": perplexity at every length at most 5% above that at 1x


@dataclass(frozen=True)
class Verdict:
    holds: bool | None  # None: the rung cannot test it
    why: str  # what failed (or why it cannot be tested); "" where it holds


Check = Callable[[RungResult], Verdict]


@dataclass(frozen=True)
class Claim:
    key: str
    text: str  # the README's sentence, with the test's threshold where it needs one
    check: Check


class Untestable(Exception):
    """A rung lacks what a claim reads."""


def _seeds(res: RungResult, label: str) -> pd.DataFrame:
    wide = res.per_seed()
    if label not in wide.index.get_level_values("label"):
        raise Untestable(f"no {label}")
    seeds = wide.loc[label]
    if len(seeds) < 2:
        raise Untestable(f"{label} has {len(seeds)} seed")
    return seeds


def growth(res: RungResult, label: str, f1: float, f2: float) -> tuple[float, float, float]:
    """``label``'s NLL at factor f2 minus at f1, paired over seeds: (mean, low, high)."""
    seeds = _seeds(res, label)
    a, b = res.factor_len(f1), res.factor_len(f2)
    if a not in seeds or b not in seeds:
        raise Untestable(f"{label} not scored at {f1}x and {f2}x")
    _, mean, low, high = t_interval(seeds[b] - seeds[a])
    return mean, low, high


def lower(res: RungResult, a: str, b: str, factor: float) -> bool | None:
    """True where ``a``'s NLL is below ``b``'s at ``factor`` and the seeds separate them,
    False where it is above and separated, None where they are not separated."""
    sa, sb = _seeds(res, a), _seeds(res, b)
    length = res.factor_len(factor)
    if length not in sa or length not in sb:
        raise Untestable(f"{a} or {b} not scored at {factor}x")
    n, mean, low, high = t_interval((sa[length] - sb[length]).dropna())
    if n < 2 or not (high < 0 or low > 0):
        return None
    return mean < 0


def _all(parts: list[tuple[bool, str]]) -> Verdict:
    failed = [why for ok, why in parts if not ok]
    return Verdict(not failed, "; ".join(failed))


def breaks_after_training(labels: tuple[str, ...]) -> Check:
    def check(res: RungResult) -> Verdict:
        parts = []
        for lab in labels:
            mean, low, _ = growth(res, lab, 1, 2)
            ratio = math.exp(mean)
            parts.append((low > 0 and ratio >= BREAK_RATIO, f"{lab} 2x/1x = {ratio:.2f}"))
        return _all(parts)

    return check


def degrades_steadily(label: str) -> Check:
    def check(res: RungResult) -> Verdict:
        parts = []
        for f1, f2 in itertools.pairwise(FACTORS):
            mean, low, _ = growth(res, label, f1, f2)
            parts.append((low > 0, f"{label} {f1}x->{f2}x: {mean:+.3f} nats, not separated"))
        return _all(parts)

    return check


def stays_flat(labels: tuple[str, ...]) -> Check:
    def check(res: RungResult) -> Verdict:
        parts = []
        for lab in labels:
            worst = max(math.exp(growth(res, lab, 1, f)[0]) for f in FACTORS[1:])
            parts.append((worst <= FLAT_RATIO, f"{lab} up to {worst:.2f}x its 1x perplexity"))
        return _all(parts)

    return check


def better_at(a: str, b: str, factors: tuple[float, ...], reverse: bool = False) -> Check:
    """``a`` below ``b`` at each factor, separated (``reverse``: above)."""

    def check(res: RungResult) -> Verdict:
        parts = []
        for f in factors:
            got = lower(res, a, b, f)
            want = not reverse
            word = "not separated from" if got is None else ("better than" if got else "worse than")
            parts.append((got is want, f"{a} {word} {b} at {f}x"))
        return _all(parts)

    return check


CLAIMS = (
    Claim(
        "absolute_break",
        "sinusoidal and learned absolute positions break right after the training length "
        f"(perplexity at 2x at least {BREAK_RATIO}x that at 1x, separated)",
        breaks_after_training(("sinusoidal", "learned")),
    ),
    Claim(
        "rope_degrades",
        "RoPE degrades steadily (worse at every doubling, separated)",
        degrades_steadily("rope"),
    ),
    Claim(
        "flat",
        f"ALiBi and Transformer-XL stay flat (perplexity at most {FLAT_RATIO}x that at 1x at "
        "every length)",
        stays_flat(("alibi", "xl")),
    ),
    Claim(
        "xl_beats_alibi",
        "Transformer-XL is better than ALiBi at every length",
        better_at("xl", "alibi", FACTORS),
    ),
    Claim("t5_near", "T5 beats ALiBi at 1x-2x", better_at("t5", "alibi", (1, 2))),
    Claim("t5_far", "T5 falls behind ALiBi from 8x", better_at("t5", "alibi", (8, 16), True)),
    Claim(
        "ntk_helps",
        "NTK-aware scaling cuts RoPE's loss from 2x on",
        better_at("rope+ntk", "rope", FACTORS[1:]),
    ),
    Claim(
        "pi_hurts",
        "position interpolation without fine-tuning makes RoPE worse at 2x-8x",
        better_at("rope+pi", "rope", (2, 4, 8), True),
    ),
)


def verdict(claim: Claim, res: RungResult) -> Verdict:
    try:
        return claim.check(res)
    except Untestable as why:
        return Verdict(None, str(why))


def claim_table(results: list[RungResult]) -> pd.DataFrame:
    """Claim x rung: ``holds``, ``no: <what failed>`` or ``–: <why untestable>``."""
    rows = {}
    for claim in CLAIMS:
        cells = {}
        for res in results:
            v = verdict(claim, res)
            cells[res.rung.name] = (
                "holds" if v.holds else (f"no: {v.why}" if v.holds is False else f"–: {v.why}")
            )
        rows[claim.key] = cells
    return pd.DataFrame.from_dict(rows, orient="index")


def claims_markdown(table: pd.DataFrame) -> list[str]:
    """One sentence per claim: the rungs where it holds and, for the others, what failed."""
    lines = []
    for claim in CLAIMS:
        cells = table.loc[claim.key]
        holds = [rung for rung, cell in cells.items() if cell == "holds"]
        fails = [f"{rung} ({cell[4:]})" for rung, cell in cells.items() if cell.startswith("no")]
        untested = [rung for rung, cell in cells.items() if cell.startswith("–")]
        text = f"- **{claim.text[0].upper()}{claim.text[1:]}**: "
        text += f"holds at {', '.join(holds)}" if holds else "holds at no rung"
        text += f"; not at {'; '.join(fails)}" if fails else ""
        text += f"; not testable at {', '.join(untested)}" if untested else ""
        lines.append(text + ".")
    return [*lines, ""]
