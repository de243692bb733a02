"""``eval.modes: [truncate]`` for a pretrained model: the papers' own perplexity protocol.

jquesnelle/yarn ``eval/perplexity.py --truncate`` (YaRN's Table 6 and its Tables 1-2, on
Proof-pile): each of a few long documents is truncated to the window, the tokenizer's BOS put
before it where it has one (``add_start_token``), and every position of that one window is
scored; the perplexity is exp of the mean over documents of each one's mean NLL. Here the
documents are the test split's first ``eval.documents`` pieces of the longest eval length's
tokens, back to back, after slice k's ``k x documents`` (so at every length each document is cut
to its first L - 1 tokens, BOS first, or to its first L without one); a window of L tokens
scores its L - 1 next tokens, the first from BOS alone (the first token without BOS is
context only).

So a window's targets have 0 to L - 2 tokens of context, all of them inside the document: at
2x the pretraining context half of them sit within it. That is what the papers' tables
measure, and why a number here is set beside theirs (``--compare``); the tail mode
(``pretrained.tail``) measures the model deep in a long context instead.

The per-position loss of every window is kept, in the report's log-spaced buckets of
positions (``stats.log_buckets``), so the report draws loss by position with intervals
over documents.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.run.evaluate import EvalResult
from pe_bench.run.train import autocast
from pe_bench.stats import log_buckets


def windows(ids: Tensor, documents: int, doc_len: int, length: int, bos: int | None) -> Tensor:
    """``[documents, length]``: each document (``doc_len`` tokens of ``ids``, back to back)
    truncated to the window, BOS first where there is one."""
    if length > doc_len or len(ids) < documents * doc_len:
        raise ValueError(f"truncate: {documents} documents of {doc_len} tokens, window {length}")
    docs = ids[: documents * doc_len].view(documents, doc_len)
    if bos is None:
        return docs[:, :length]
    return torch.cat([torch.full((documents, 1), bos, dtype=docs.dtype), docs[:, : length - 1]], 1)


@torch.no_grad()
def score_truncated(
    model: nn.Module,
    ids: Tensor,
    documents: int,
    doc_len: int,
    length: int,
    bos: int | None,
    batch_tokens: int,
    device: torch.device,
) -> tuple[EvalResult, list[list[float | None]]]:
    """Score every position of each document's window (``windows``): the result (per-position
    sums over documents; offset L - 1 predicts past the document, unscored) and each
    document's mean loss in each bucket of ``log_buckets(length)`` (position p = offset p - 1;
    None for a bucket with nothing scored)."""
    x_all = windows(ids, documents, doc_len, length, bos)
    nll = torch.empty(documents, length - 1, dtype=torch.float64)
    model.eval()
    size = max(1, batch_tokens // length)
    for i in range(0, documents, size):
        x = x_all[i : i + size].to(device)
        with autocast(device):
            logits = model(x)[:, :-1]  # [b, L - 1, vocab]
        nll[i : i + size] = (
            F.cross_entropy(logits.float().transpose(1, 2), x[:, 1:], reduction="none")
            .double()
            .cpu()
        )
    position_sum = torch.cat([nll.sum(0), torch.zeros(1, dtype=torch.float64)])
    counts = torch.full((length,), documents, dtype=torch.long)
    counts[-1] = 0
    result = EvalResult(float(nll.sum()), documents * (length - 1), position_sum, counts)
    return result, bucket_means(nll, length)


def bucket_means(nll: Tensor, length: int) -> list[list[float | None]]:
    """Each row's mean loss in each bucket of ``log_buckets(length)`` (positions p of the
    window, 1-based, at column p - 1; None where the bucket has no column)."""
    edges = log_buckets(length)
    out = []
    for row in nll.tolist():
        means = []
        for lo, hi in itertools.pairwise(edges):
            cells = row[lo - 1 : min(hi - 1, len(row))]
            means.append(sum(cells) / len(cells) if cells else None)
        out.append(means)
    return out


def scored_bytes(
    byte_ends: Tensor, first: int, documents: int, doc_len: int, length: int, bos: int | None
) -> int:
    """UTF-8 bytes of the tokens the windows score (``byte_ends``: the stream's bytes up to the
    end of each token): with BOS each document's first L - 1 tokens, without its tokens 1 to
    L - 1."""
    total = 0
    for j in range(documents):
        start = first + j * doc_len + (0 if bos is not None else 1)
        stop = start + length - 2  # the last scored token
        total += int(byte_ends[stop]) - (int(byte_ends[start - 1]) if start > 0 else 0)
    return total
