"""Masks researchers write, as they write them: the cookbook's, attention-gym's NATTEN family, local + global
tokens, windows with prefixes, chunks, dilation. Shared by the analysis benchmark (bench_analysis.py) and the
brute-force soundness/exactness tests (tests/test_mask_zoo.py).

Each entry: name -> (mask_mod factory taking the sequence length, whether the block map must be exact).
"Exact" marks the families issue 15 asks exact maps for; every other entry must be sound.
"""
from __future__ import annotations

import functools

import torch


def _natten_1d(L, K=64):
    # attention-gym NATTEN-1D: the window is clamped at the borders, so every query sees 2K + 1 keys
    def natten_1d(b, h, q_idx, kv_idx):
        center = torch.clamp(q_idx, K, L - 1 - K)
        return torch.abs(center - kv_idx) <= K

    return natten_1d


def _natten_1d_where(L, K=64):
    def natten_1d_where(b, h, q_idx, kv_idx):
        center = torch.where(q_idx < K, K, torch.where(q_idx > L - 1 - K, L - 1 - K, q_idx))
        return torch.abs(center - kv_idx) <= K

    return natten_1d_where


def _natten_1d_start_end(L, K=64):
    def natten_1d_start_end(b, h, q_idx, kv_idx):
        start = torch.clamp(q_idx - K, 0, L - 1 - 2 * K)
        return (kv_idx >= start) & (kv_idx <= start + 2 * K)

    return natten_1d_start_end


def _natten_2d(L, W=128, K=7):
    # attention-gym NATTEN-2D on a flattened H x W image (row = idx // W, column = idx % W)
    H = L // W

    def natten_2d(b, h, q_idx, kv_idx):
        q_r, q_c = q_idx // W, q_idx % W
        kv_r, kv_c = kv_idx // W, kv_idx % W
        c_r = torch.clamp(q_r, K, H - 1 - K)
        c_c = torch.clamp(q_c, K, W - 1 - K)
        return (torch.abs(c_r - kv_r) <= K) & (torch.abs(c_c - kv_c) <= K)

    return natten_2d


def _tiled_natten_2d(L, W=128, T=8, K=2):
    # attention-gym tiled NATTEN: neighbourhoods of T x T tiles instead of pixels
    H = L // W

    def tiled_natten_2d(b, h, q_idx, kv_idx):
        q_r, q_c = q_idx // W // T, q_idx % W // T
        kv_r, kv_c = kv_idx // W // T, kv_idx % W // T
        c_r = torch.clamp(q_r, K, H // T - 1 - K)
        c_c = torch.clamp(q_c, K, W // T - 1 - K)
        return (torch.abs(c_r - kv_r) <= K) & (torch.abs(c_c - kv_c) <= K)

    return tiled_natten_2d


def _dilated_natten_1d(L, K=32, D=4):
    # dilated NATTEN-1D: neighbours at stride D within the query's residue class
    def dilated_natten_1d(b, h, q_idx, kv_idx):
        center = torch.clamp(q_idx // D, K, L // D - 1 - K)
        return (q_idx % D == kv_idx % D) & (torch.abs(center - kv_idx // D) <= K)

    return dilated_natten_1d


def _local_global(L, W=512, G=64):
    def local_global(b, h, q_idx, kv_idx):
        return (torch.abs(q_idx - kv_idx) <= W) | (kv_idx < G) | (q_idx < G)

    return local_global


def _window_global(L, W=1024, G=8):
    def window_global(b, h, q_idx, kv_idx):
        return ((q_idx >= kv_idx) & (q_idx - kv_idx < W)) | ((kv_idx < G) & (q_idx >= kv_idx))

    return window_global


def _alibi_window_global(L, W=1024, G=8, device="cpu"):
    slopes = torch.exp2(-torch.arange(1, 17, dtype=torch.float32) * 0.5).to(device)

    def alibi_window_global(b, h, q_idx, kv_idx):
        near = (q_idx - kv_idx < W) & (q_idx >= kv_idx)
        return near | (kv_idx < G) | (slopes[h] * (q_idx - kv_idx) < 4.0)

    return alibi_window_global


def _sliding_prefix(L, W=1024, P=2048):
    def sliding_prefix(b, h, q_idx, kv_idx):
        return (kv_idx < P) | ((q_idx >= kv_idx) & (q_idx - kv_idx < W))

    return sliding_prefix


def _chunked_causal(L, C=1024):
    def chunked_causal(b, h, q_idx, kv_idx):
        return (q_idx // C == kv_idx // C) & (q_idx >= kv_idx)

    return chunked_causal


def _chunked_window(L, C=2048, W=256):
    def chunked_window(b, h, q_idx, kv_idx):
        return (q_idx // C == kv_idx // C) | ((q_idx >= kv_idx) & (q_idx - kv_idx < W))

    return chunked_window


def _dilated_window(L, W=1024, D=2):
    def dilated_window(b, h, q_idx, kv_idx):
        return (torch.abs(q_idx - kv_idx) <= W) & ((q_idx - kv_idx) % D == 0)

    return dilated_window


def _strided(L, S=128):
    # sparse-transformer strided pattern: the local band of S plus every S-th column
    def strided(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((q_idx - kv_idx < S) | ((q_idx - kv_idx) % S == 0))

    return strided


def _sink_window(L, W=1024, G=4):
    def sink_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((kv_idx < G) | (q_idx - kv_idx < W))

    return sink_window


def _causal(L):
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return causal


def _sliding(L, W=1024):
    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < W)

    return sliding


def _local(L, left=256, right=128):
    def local(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx <= left) & (kv_idx - q_idx <= right)

    return local


def _prefix_lm(L, P=2048):
    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx < P) | (q_idx >= kv_idx)

    return prefix_lm


def _block_diagonal(L, S=384):
    def block_diagonal(b, h, q_idx, kv_idx):
        return q_idx // S == kv_idx // S

    return block_diagonal


def _dilated_causal(L, W=1024, D=4):
    def dilated_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < W) & ((q_idx - kv_idx) % D == 0)

    return dilated_causal


def _document(L, n_docs=8, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randperm(L - 1, generator=g)[: n_docs - 1] + 1).values
    ids = torch.zeros(L, dtype=torch.int32)
    ids[cuts] = 1
    ids = torch.cumsum(ids, 0).to(torch.int32).to(device)

    def document_causal(b, h, q_idx, kv_idx):
        return (ids[q_idx] == ids[kv_idx]) & (q_idx >= kv_idx)

    return document_causal


def _document_unsorted(L, n_ids=5, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, n_ids, (L,), generator=g, dtype=torch.int32).to(device)

    def document_unsorted(b, h, q_idx, kv_idx):
        return ids[q_idx] == ids[kv_idx]

    return document_unsorted


# name -> (factory(L), exact): "exact" = a family issue 15 asks exact block maps for
ZOO = {
    "causal": (_causal, True),
    "sliding_window": (_sliding, True),
    "local": (_local, True),
    "prefix_lm": (_prefix_lm, True),
    "block_diagonal": (_block_diagonal, True),
    "chunked_causal": (_chunked_causal, True),
    "chunked_window": (_chunked_window, False),
    "sink_window": (_sink_window, True),
    "sliding_prefix": (_sliding_prefix, True),
    "local_global": (_local_global, True),
    "window_global": (_window_global, True),
    "alibi_window_global": (_alibi_window_global, False),
    "dilated_window": (_dilated_window, True),
    "dilated_causal": (_dilated_causal, True),
    "strided": (_strided, True),
    "natten_1d": (_natten_1d, True),
    "natten_1d_where": (_natten_1d_where, True),
    "natten_1d_start_end": (_natten_1d_start_end, True),
    "natten_2d": (_natten_2d, True),
    "natten_2d_narrow": (functools.partial(_natten_2d, W=64, K=3), True),  # several image rows per tile
    "tiled_natten_2d": (_tiled_natten_2d, True),
    "dilated_natten_1d": (_dilated_natten_1d, True),
    "document_causal": (_document, False),
    "document_unsorted": (_document_unsorted, False),
}


# the same masks at test scale (L = 2048, brute-forced in tests/test_mask_zoo.py): windows, chunks and image
# sizes shrunk so every family keeps its shape (several image rows per tile or tiles per image row, borders)
SMALL = {
    "sliding_window": dict(W=200), "local": dict(left=100, right=37), "prefix_lm": dict(P=300),
    "block_diagonal": dict(S=96), "chunked_causal": dict(C=160), "chunked_window": dict(C=256, W=64),
    "sink_window": dict(W=150, G=4), "sliding_prefix": dict(W=150, P=200), "local_global": dict(W=100, G=40),
    "window_global": dict(W=150, G=8), "alibi_window_global": dict(W=150, G=8), "dilated_window": dict(W=150, D=2),
    "dilated_causal": dict(W=300, D=4), "strided": dict(S=48), "natten_1d": dict(K=40),
    "natten_1d_where": dict(K=40), "natten_1d_start_end": dict(K=40), "natten_2d": dict(W=64, K=3),
    "natten_2d_narrow": dict(W=32, K=2), "tiled_natten_2d": dict(W=64, T=4, K=2), "dilated_natten_1d": dict(K=20, D=4),
    "document_causal": dict(n_docs=6), "document_unsorted": dict(n_ids=5),
}


def make(name: str, L: int, small: bool = False, device="cpu"):
    """The mask_mod of zoo entry ``name`` for sequences of ``L`` positions; ``small`` picks the test-scale
    parameters (SMALL); captured tensors are made on ``device``."""
    import inspect

    factory, _ = ZOO[name]
    kw = dict(SMALL.get(name, {}) if small else {})
    if "device" in inspect.signature(factory).parameters:
        kw["device"] = device
    return factory(L, **kw)
