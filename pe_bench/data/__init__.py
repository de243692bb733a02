"""Corpora, tokenizers and synthetic tasks: what a model reads."""
