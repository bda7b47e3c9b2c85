#!/usr/bin/env python
"""Greedy decoding of a small Llama-shaped model (issue 12): attngen's ``with_kvcache`` beside SDPA, each decode
step one CUDA graph replayed once per new token; tokens/s of both and how far their tokens agree.

The model (random weights from a fixed seed): RMSNorm, RoPE (theta 10000, GPT-NeoX half-split pairing as Llama),
grouped-query attention, SwiGLU MLP, untied LM head; by default 4 layers, hidden 2048, 32 query heads over 8 kv
heads of dim 64, MLP 5632, vocab 32000, bf16 on CUDA. Two attention backends behind the one model:

  attngen  ``attngen.compile(mask_mod=attngen.causal())``. Prefill: ``attn(q, k, v)`` (the forward kernel) on the
           rotated prompt, whose keys and values are then copied into the cache; the decode kernel is meant for
           a few queries per sequence, not 2k. Decode: ``attn.with_kvcache(q, k_cache, v_cache, k, v,
           cache_seqlens=..., rotary_cos=..., rotary_sin=...)`` on unrotated q / k, so the call's own RoPE and
           append run (the cache holds rotated keys, as flash-attn's).
  sdpa     ``scaled_dot_product_attention``: prefill causal with ``enable_gqa``; decode rotates q / k itself, writes
           the new key at each sequence's position and attends over the whole cache under a boolean mask of the
           valid prefix (a static shape, so one graph serves every step), the query heads of a kv head packed as
           the query rows of one call (no repeated K / V).

The loop: prefill the prompt (its last logits give token 0), then ``new - 1`` decode steps, each embedding the
previous token, appending at ``cache_seqlens`` (a device tensor every layer reads; incremented in place inside the
step) and taking the argmax, which the step writes back into its own input buffer. On CUDA the step is captured
once (torch.cuda.CUDAGraph) and replayed; elsewhere it runs eagerly (CPU tensors: attngen's reference path).

Agreement: free-running token equality of the two loops (fraction, first divergence per sequence, SDPA's top-2
logit gap there); and teacher-forced, SDPA run over attngen's own tokens: where SDPA's argmax differs from
attngen's token, the disagreement counts as significant when SDPA's best logit exceeds its logit of attngen's
token by more than ``--threshold`` (default THRESHOLD, 0.1) times the std of the logits: bf16 rounding of nearly
tied logits is not an error, a wrong key, position or mask is. The exit status is 1 when any disagreement is
significant.

Speed: decode tokens/s = batch * (new - 1) / wall time of the decode steps (synchronised around them); the
prefill is timed on its second call (the first builds or loads the kernels). SDPA's decode reads the whole cache,
up to new / (prompt + new) more keys than the valid prefix (11% at the defaults), as a static-shape graph must.

    python benchmarks/llama_decode.py --out DIR [--batch 8 --prompt 2048 --new 256 --layers 4 --head-dim 64]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "benchmarks"):  # run as a script from anywhere
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import attngen  # noqa: E402
from bench_forward import fmt as _fmt, write_results as _write_results  # noqa: E402


# ---------------------------------------------------------------- the model

@dataclass
class LlamaConfig:
    vocab: int = 32000
    hidden: int = 2048
    layers: int = 4
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 64
    intermediate: int = 5632  # TinyLlama's for hidden 2048 (8/3 * hidden, rounded up to 256)
    rope_theta: float = 10000.0
    eps: float = 1e-5
    # the gain on the q and k projections' init: attention scores of std ~qk_gain**2, so that attention is peaked
    # enough for the tokens to depend on which keys it reads (at gain 1 it averages hundreds of the prompt's keys)
    qk_gain: float = 1.5


class Rope:
    """RoPE tables (positions, head_dim / 2) in the model dtype, as ``with_kvcache`` takes them, and Llama's
    rotation (q * cos + rotate_half(q) * sin), here formed in float32 and rounded once (Hugging Face's runs in the
    model dtype): what with_kvcache does to the keys it appends, so both backends cache the same bits."""

    def __init__(self, head_dim: int, positions: int, theta: float, device, dtype):
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
        angles = torch.arange(positions, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, H, L, D) at positions (B, L) (int, absolute) -> rotated, x's dtype."""
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos = self.cos[positions].unsqueeze(1).to(compute)  # (B, 1, L, D / 2)
        sin = self.sin[positions].unsqueeze(1).to(compute)
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        xf = x.to(compute)
        x1, x2 = xf.chunk(2, dim=-1)
        return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class Llama:
    """Random weights (normal, std 1 / sqrt(fan_in): activations keep their scale at any width) from ``seed``.
    ``capacity``: the longest sequence (prompt + new tokens) the RoPE tables cover."""

    def __init__(self, cfg: LlamaConfig, capacity: int, device, dtype, seed: int = 0):
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        gen = torch.Generator(device=self.device).manual_seed(seed)

        def weight(rows, cols, gain=1.0):
            w = torch.randn(rows, cols, generator=gen, device=self.device, dtype=torch.float32)
            return (w * (gain / math.sqrt(cols))).to(dtype)

        H, Hkv, D, C = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.hidden
        self.embed = torch.randn(cfg.vocab, C, generator=gen, device=self.device).to(dtype)
        self.blocks = [dict(attn_norm=torch.ones(C, device=self.device, dtype=dtype),
                            wq=weight(H * D, C, cfg.qk_gain), wk=weight(Hkv * D, C, cfg.qk_gain), wv=weight(Hkv * D, C),
                            wo=weight(C, H * D), mlp_norm=torch.ones(C, device=self.device, dtype=dtype),
                            w_gate=weight(cfg.intermediate, C), w_up=weight(cfg.intermediate, C),
                            w_down=weight(C, cfg.intermediate))
                       for _ in range(cfg.layers)]
        self.final_norm = torch.ones(C, device=self.device, dtype=dtype)
        self.lm_head = weight(cfg.vocab, C)
        self.rope = Rope(D, capacity, cfg.rope_theta, self.device, dtype)

    def _forward(self, tokens: torch.Tensor, attend) -> torch.Tensor:
        """tokens (B, L) -> the last position's hidden state (B, hidden); ``attend(layer, q, k, v)`` takes the
        unrotated (B, H, L, D) projections and returns (B, Hq, L, D)."""
        cfg = self.cfg
        B, L = tokens.shape
        x = self.embed[tokens]
        for i, w in enumerate(self.blocks):
            h = rms_norm(x, w["attn_norm"], cfg.eps)
            q = F.linear(h, w["wq"]).view(B, L, cfg.heads, cfg.head_dim).transpose(1, 2)
            k = F.linear(h, w["wk"]).view(B, L, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
            v = F.linear(h, w["wv"]).view(B, L, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
            a = attend(i, q, k, v)
            x = x + F.linear(a.transpose(1, 2).reshape(B, L, cfg.heads * cfg.head_dim), w["wo"])
            h = rms_norm(x, w["mlp_norm"], cfg.eps)
            x = x + F.linear(F.silu(F.linear(h, w["w_gate"])) * F.linear(h, w["w_up"]), w["w_down"])
        return x[:, -1]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, hidden) -> float32 logits (B, vocab); the LM head runs in the model dtype, as in serving."""
        return F.linear(rms_norm(x, self.final_norm, self.cfg.eps), self.lm_head).float()

    def prefill(self, prompt: torch.Tensor, cache: "KVCache") -> torch.Tensor:
        """Fill ``cache`` with the prompt (B, P) and set its lengths to P; returns the last position's logits."""
        x = self._forward(prompt, cache.prefill)
        cache.seqlens.fill_(prompt.shape[1])
        return self.logits(x)

    def step(self, tokens: torch.Tensor, cache: "KVCache") -> torch.Tensor:
        """One decode step: tokens (B,) at positions ``cache.seqlens``, appended to the cache; returns their
        logits and advances the lengths by one (in place: the step is captured in a CUDA graph)."""
        x = self._forward(tokens.view(-1, 1), cache.decode)
        cache.seqlens.add_(1)
        return self.logits(x)


# ---------------------------------------------------------------- the two attention backends

class KVCache:
    """Per layer a (B, Hkv, capacity, D) key and value cache, zero-filled, and the cached length of each sequence
    (int32 (B,), ``cache_seqlens``); keys are stored rotated."""

    def __init__(self, model: Llama, batch: int, capacity: int):
        cfg = model.cfg
        shape = (batch, cfg.kv_heads, capacity, cfg.head_dim)
        self.rope = model.rope
        self.k = [torch.zeros(shape, device=model.device, dtype=model.dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=model.device, dtype=model.dtype) for _ in range(cfg.layers)]
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=model.device)
        self.batch_index = torch.arange(batch, device=model.device)
        self.cache_positions = torch.arange(capacity, device=model.device)

    def _prefill_rotated(self, layer, q, k, v):
        """Rotate the prompt's q and k (positions 0 .. P - 1) and store k, v into the cache; returns (q, k)."""
        B, _, P, _ = q.shape
        positions = self.cache_positions[:P].expand(B, P)
        q, k = self.rope(q, positions), self.rope(k, positions)
        self.k[layer][:, :, :P] = k
        self.v[layer][:, :, :P] = v
        return q, k

    def prefill(self, layer, q, k, v):
        raise NotImplementedError

    def decode(self, layer, q, k, v):
        raise NotImplementedError


class SdpaCache(KVCache):
    def prefill(self, layer, q, k, v):
        q, k = self._prefill_rotated(layer, q, k, v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def decode(self, layer, q, k, v):
        B, Hq, _, D = q.shape
        Hkv = k.shape[1]
        positions = self.seqlens.long().view(B, 1)
        q, k = self.rope(q, positions), self.rope(k, positions)
        self.k[layer][self.batch_index, :, positions[:, 0]] = k[:, :, 0]
        self.v[layer][self.batch_index, :, positions[:, 0]] = v[:, :, 0]
        valid = (self.cache_positions.view(1, -1) <= positions).view(B, 1, 1, -1)  # keys 0 .. s_b (the new one)
        # query head h reads kv head h // (Hq / Hkv): a kv head's query heads are the query rows of one call
        out = F.scaled_dot_product_attention(q.reshape(B, Hkv, Hq // Hkv, D), self.k[layer], self.v[layer],
                                             attn_mask=valid)
        return out.view(B, Hq, 1, D)


class AttngenCache(KVCache):
    def __init__(self, model: Llama, batch: int, capacity: int):
        super().__init__(model, batch, capacity)
        self.attn = attngen.compile(mask_mod=attngen.causal())

    def prefill(self, layer, q, k, v):
        q, k = self._prefill_rotated(layer, q, k, v)
        return self.attn(q, k, v)

    def decode(self, layer, q, k, v):
        # unrotated q and k: with_kvcache rotates both at cache_seqlens and appends k, v there
        return self.attn.with_kvcache(q, self.k[layer], self.v[layer], k, v, cache_seqlens=self.seqlens,
                                      rotary_cos=self.rope.cos, rotary_sin=self.rope.sin, rotary_interleaved=False)


BACKENDS = {"attngen": AttngenCache, "sdpa": SdpaCache}


# ---------------------------------------------------------------- the greedy loop

@dataclass
class Generation:
    """One greedy loop. Per (sequence, step), step 0 being the prefill's logits: ``tokens`` the token fed forward
    (the argmax, or the forced token), ``pred`` the argmax, ``gap`` the top-1 minus top-2 logit, ``regret`` the
    top-1 logit minus the fed token's, ``std`` the std of the logits; ``logits`` (B, N, vocab) when kept."""

    tokens: torch.Tensor
    pred: torch.Tensor
    gap: torch.Tensor
    regret: torch.Tensor
    std: torch.Tensor
    logits: Optional[torch.Tensor]
    prefill_s: float = 0.0
    decode_s: float = 0.0
    graphed: bool = False


class _Recorder:
    """Preallocated per-step records, written at the column a device-side step counter names (in a graph too)."""

    def __init__(self, B: int, N: int, vocab: int, device, keep_logits: bool):
        self.tokens = torch.full((B, N), -1, dtype=torch.long, device=device)
        self.pred = torch.full((B, N), -1, dtype=torch.long, device=device)
        self.gap, self.regret, self.std = (torch.full((B, N), float("nan"), device=device) for _ in range(3))
        self.logits = torch.full((B, N, vocab), float("nan"), device=device) if keep_logits else None

    def record(self, logits: torch.Tensor, step: torch.Tensor, forced: Optional[torch.Tensor]) -> torch.Tensor:
        """Record the logits (B, vocab) of step ``step`` (long (1,)); returns the token to feed forward."""
        top2 = logits.topk(2, dim=-1).values
        pred = logits.argmax(-1)
        fed = pred if forced is None else forced.index_select(1, step).view(-1)
        chosen = logits.gather(1, fed.view(-1, 1)).view(-1)
        for buf, value in ((self.tokens, fed), (self.pred, pred), (self.gap, top2[:, 0] - top2[:, 1]),
                           (self.regret, top2[:, 0] - chosen), (self.std, logits.std(-1))):
            buf.index_copy_(1, step, value.view(-1, 1))
        if self.logits is not None:
            self.logits.index_copy_(1, step, logits.unsqueeze(1))
        return fed


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate(model: Llama, cache: KVCache, prompt: torch.Tensor, new: int, *, graph: Optional[bool] = None,
             forced: Optional[torch.Tensor] = None, keep_logits: bool = False, warmup: bool = True) -> Generation:
    """Greedy decoding of ``new`` tokens after ``prompt`` (B, P) into ``cache``: the prefill, then ``new - 1``
    decode steps, each one replay of a CUDA graph when ``graph`` (default: on CUDA). ``forced`` (B, new): feed
    these tokens instead of the argmax (teacher forcing; the records still hold the model's own argmax).
    ``warmup`` runs the prefill once untimed first (kernel builds and loads, cuBLAS handles, the reference's first
    call): the timed prefill is the second."""
    device = model.device
    graph = device.type == "cuda" if graph is None else graph
    B = prompt.shape[0]
    rec = _Recorder(B, new, model.cfg.vocab, device, keep_logits)
    if warmup:
        model.prefill(prompt, cache)
    _sync(device)
    t0 = time.perf_counter()
    logits = model.prefill(prompt, cache)
    _sync(device)
    prefill_s = time.perf_counter() - t0

    # the decode step's state, updated in place by the step itself
    step = torch.zeros(1, dtype=torch.long, device=device)
    tokens = rec.record(logits, step, forced).clone()
    step.add_(1)

    def decode_step():
        fed = rec.record(model.step(tokens, cache), step, forced)
        tokens.copy_(fed)
        step.add_(1)

    run = decode_step
    if graph:
        run = _captured(decode_step, state=(tokens, step, cache.seqlens))
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(new - 1):
        run()
    _sync(device)
    decode_s = time.perf_counter() - t0
    return Generation(rec.tokens, rec.pred, rec.gap, rec.regret, rec.std, rec.logits, prefill_s, decode_s, graph)


def _captured(fn, state):
    """``fn`` captured in a CUDA graph after one eager call on a side stream (libraries loaded, allocator
    warmed), and replayed once untimed (the graph's upload); ``state`` (the tensors fn advances) is restored after
    each, so the first timed replay is the first step, and what those calls wrote elsewhere (the record's and the
    cache's next slots) is written again by it. A host sync while capturing raises (sync debug mode 'error', on top
    of CUDA's own refusal). Returns the replay function."""
    saved = [t.clone() for t in state]

    def restore():
        for t, s in zip(state, saved):
            t.copy_(s)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    restore()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(mode)
    graph.replay()
    restore()
    return graph.replay


def random_prompt(vocab: int, batch: int, length: int, device, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).to(device)


# ---------------------------------------------------------------- agreement

# Teacher-forced noise threshold, in logit stds. The bf16 logits near the top (about 4 stds, std ~1) are multiples
# of 2^-5 ~ 0.031: two nearly tied logits each rounded the other way by one attention's last bit already differ by
# 2 ulps = 0.0625 (the CPU bf16 runs of this model showed disagreements at 0 and 0.031). A wrong key, position or
# mask moves the logits by tenths to whole stds.
THRESHOLD = 0.1


@dataclass
class Agreement:
    steps: int                          # (sequence, step) pairs compared
    equal: int                          # free-running: equal tokens
    first_divergence: List[int]         # per sequence, the first step whose tokens differ (-1: none)
    gap_at_divergence: List[float]      # SDPA's top-2 logit gap there, in logit stds (nan: no divergence)
    forced_disagree: int                # teacher-forced: SDPA's argmax is not attngen's token
    forced_significant: int             # ... and SDPA's best logit beats attngen's token by > threshold stds
    max_regret: float                   # largest (SDPA best - SDPA of attngen's token) / std over all steps
    threshold: float
    worst: List[dict] = field(default_factory=list)  # the significant disagreements (up to 10)

    @property
    def ok(self) -> bool:
        return self.forced_significant == 0


def agreement(ours: Generation, sdpa: Generation, forced: Generation, threshold: float) -> Agreement:
    """``ours`` and ``sdpa`` free-running from one prompt; ``forced`` the SDPA loop fed ``ours.tokens``."""
    differ = ours.tokens != sdpa.tokens
    first, gaps = [], []
    for b in range(differ.shape[0]):
        idx = differ[b].nonzero()
        t = int(idx[0, 0]) if idx.numel() else -1
        first.append(t)
        gaps.append(float(sdpa.gap[b, t] / sdpa.std[b, t]) if t >= 0 else float("nan"))
    regret = forced.regret / forced.std
    disagree = forced.pred != ours.tokens
    significant = disagree & (regret > threshold)
    gap = forced.gap / forced.std
    worst = [dict(seq=b, step=t, regret_std=float(regret[b, t]), gap_std=float(gap[b, t]))
             for b, t in significant.nonzero().tolist()[:10]]
    return Agreement(steps=differ.numel(), equal=int((~differ).sum()), first_divergence=first,
                     gap_at_divergence=gaps, forced_disagree=int(disagree.sum()),
                     forced_significant=int(significant.sum()), max_regret=float(regret.max()), threshold=threshold,
                     worst=worst)


def compare(model: Llama, prompt: torch.Tensor, new: int, *, threshold: float = THRESHOLD,
            graph: Optional[bool] = None, keep_logits: bool = False):
    """Both loops free-running, then SDPA teacher-forced over attngen's tokens. Returns (runs, caches, agreement):
    runs / caches by backend name ('attngen', 'sdpa', 'sdpa_forced'; the forced run reuses SDPA's cache)."""
    capacity = prompt.shape[1] + new
    caches = {name: cls(model, prompt.shape[0], capacity) for name, cls in BACKENDS.items()}
    runs = {name: generate(model, cache, prompt, new, graph=graph, keep_logits=keep_logits)
            for name, cache in caches.items()}
    runs["sdpa_forced"] = generate(model, caches["sdpa"], prompt, new, graph=graph, forced=runs["attngen"].tokens,
                                   keep_logits=keep_logits, warmup=False)
    return runs, caches, agreement(runs["attngen"], runs["sdpa"], runs["sdpa_forced"], threshold)


# ---------------------------------------------------------------- the benchmark

def table(rows: List[dict], agree: Agreement) -> str:
    lines = ["| backend | decode tokens/s | ms / step | prefill ms | end-to-end tokens/s | CUDA graph | ÷ SDPA |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {_fmt(r['decode_tokens_per_s'], 0)} | {_fmt(r['ms_per_step'], 3)} | "
                     f"{_fmt(r['prefill_ms'], 1)} | {_fmt(r['e2e_tokens_per_s'], 0)} | {r['graphed']} | "
                     f"{_fmt(r['attngen_over_sdpa'], 2) + 'x' if 'attngen_over_sdpa' in r else ''} |")
    diverged = [(b, t, g) for b, (t, g) in enumerate(zip(agree.first_divergence, agree.gap_at_divergence)) if t >= 0]
    lines += [
        "",
        "| agreement | |",
        "|---|---|",
        f"| free-running tokens equal | {agree.equal} / {agree.steps} ({100 * agree.equal / agree.steps:.1f}%) |",
        f"| first divergence (sequence: step, SDPA top-2 gap in logit stds) | "
        f"{', '.join(f'{b}: {t}, {g:.3f}' for b, t, g in diverged) or 'none'} |",
        f"| teacher-forced: SDPA's argmax ≠ attngen's token | {agree.forced_disagree} / {agree.steps} |",
        f"| ... of which SDPA prefers its argmax by > {agree.threshold} logit std | {agree.forced_significant} |",
        f"| largest (SDPA best − SDPA of attngen's token) / std | {agree.max_regret:.4f} |",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--new", type=int, default=256, help="tokens generated (the prefill's + new - 1 decode steps)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", type=float, default=THRESHOLD,
                   help="teacher-forced noise threshold, in logit stds (see THRESHOLD)")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs (every step launched from Python)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latest"))
    args = p.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # CPU: attngen's float reference
    cfg = LlamaConfig(vocab=args.vocab, hidden=args.hidden, layers=args.layers, head_dim=args.head_dim)
    model = Llama(cfg, args.prompt + args.new, device, dtype, seed=args.seed)
    prompt = random_prompt(cfg.vocab, args.batch, args.prompt, device, seed=args.seed + 1)
    if device.type == "cuda":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import bench_forward as bf

        bf.heat_gpu(device)
    runs, _, agree = compare(model, prompt, args.new, threshold=args.threshold,
                             graph=False if args.eager else None)
    steps = args.new - 1
    rows = {name: {"backend": name, "graphed": r.graphed, "prefill_ms": r.prefill_s * 1e3,
                   "ms_per_step": r.decode_s * 1e3 / max(steps, 1),
                   "decode_tokens_per_s": args.batch * steps / r.decode_s if r.decode_s else None,
                   "e2e_tokens_per_s": args.batch * args.new / (r.prefill_s + r.decode_s)}
            for name, r in runs.items() if name in BACKENDS}
    ours, sdpa = rows["attngen"]["decode_tokens_per_s"], rows["sdpa"]["decode_tokens_per_s"]
    if ours and sdpa:
        rows["attngen"]["attngen_over_sdpa"] = ours / sdpa
    for row in rows.values():
        print(f"[{row['backend']}] {row}", flush=True)
    _write_results(args.out, "llama_decode", args, list(rows.values()), table(list(rows.values()), agree),
                   extra={"agreement": {**vars(agree), "ok": agree.ok}})
    return 0 if agree.ok else 1


if __name__ == "__main__":
    sys.exit(main())
