"""Pretrained Hugging Face models under pe-bench's protocol, and passkey retrieval."""
