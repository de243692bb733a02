"""pe-bench: train identical small LMs that differ only in their position scheme, evaluate them
far past their training length, and report the result."""

from pe_bench.resolvers import register_resolvers

__version__ = "0.1.0"

register_resolvers()  # conf/'s ${run_dir:} and others, for any process that reads a config
