"""The decoder-only LM and its one attention op."""
