"""A plugin module that fails while it is imported (``pe-bench`` must say so in one line)."""

raise RuntimeError("cannot reach the plugin's license server")
