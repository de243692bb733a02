"""The command line: one module per console script (pyproject's ``[project.scripts]``), each a
thin layer over the packages below it.

- ``bench``: ``pe-bench`` (and ``python -m pe_bench.cli``), one Hydra job or sweep;
  ``command_line`` checks its command line before Hydra runs anything.
- ``report``: ``pe-bench-report``, a report of a folder of records.
- ``check``: ``pe-bench-check``, the conformance kit on one scheme.
- ``place``: ``pe-bench-place``, a scheme on a committed sweep's leaderboard.
- ``hydra_private``: the one module that reaches into ``hydra._internal``.
- ``console``: what every script does around its work (a bad ``OMP_NUM_THREADS`` and Ctrl-C
  in one line), and the entry points pyproject names, which import each script's module
  inside it.
"""


def main() -> None:
    """``pe-bench`` for console scripts installed before the command line was this package
    (they name ``pe_bench.cli:main``); ``pip install -e .`` installs ``cli.console``'s."""
    from pe_bench.cli.console import pe_bench

    pe_bench()
