"""Published tables to compare reports with (``pe-bench-report DIR --compare published/NAME``).

This folder ships inside the package as ``pe_bench.published`` (see pyproject.toml); the
format is described in its README.md.
"""
