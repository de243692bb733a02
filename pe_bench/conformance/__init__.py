"""The plugin kit behind ``pe-bench-check``: does a scheme keep the contract the model relies
on? ``assert_conforms`` is what a plugin's own tests call."""

from pe_bench.conformance.kit import CheckReport, assert_conforms, check_scheme

__all__ = ["CheckReport", "assert_conforms", "check_scheme"]
