"""``python -m pe_bench.cli``: ``pe-bench`` (as torchrun and the tests start it)."""

from pe_bench.cli.console import pe_bench

pe_bench()
