"""attn.with_kvcache and attn.varlen on the reference path: the contract the decode and varlen kernels (issue 12)
will be held to.

Goldens are built here without attngen.kvcache / attngen.varlen: the cache is gathered, rotated and appended
with plain tensor ops, and attention is either attngen.reference.attention per sequence (bit-level comparisons)
or the float64 dense golden of tests/reference64.py with the mods' b shifted by hand (variant comparisons).
Unused cache entries are poisoned with NaN: reading one turns an output NaN, writing one changes its bits.
"""
import math

import pytest
import torch

import attngen
import attngen.variants as V
from attngen.errors import InputError
from attngen.kvcache import MAX_PAGE_SIZE
from attngen.sequences import GpuPathNotAvailable

import reference64

NAN = float("nan")
I32 = torch.int32


def same_bits(a, b):
    """Bitwise equality, NaN poison included."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}[a.dtype]
    return a.shape == b.shape and torch.equal(a.view(ints), b.view(ints))


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def rope_tables(n, rotary_dim, dtype=torch.float32):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rope_by_hand(x, cos, sin, positions, interleaved):
    """HF-style RoPE (rotate_half on duplicated tables), an independent formulation of attngen.rotary."""
    rd = 2 * cos.shape[1]
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    c, s = cos[positions].to(compute), sin[positions].to(compute)
    xr = x[..., :rd].to(compute)
    if interleaved:
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rotated_half = torch.stack((-x2, x1), dim=-1).flatten(-2)
    else:
        c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
        x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
        rotated_half = torch.cat((-x2, x1), dim=-1)
    return torch.cat(((xr * c + rotated_half * s).to(x.dtype), x[..., rd:]), dim=-1)


class Case:
    """A contiguous cache with `starts[b]` cached keys per sequence (NaN beyond), queries and new keys."""

    def __init__(self, seed=0, B=3, Hq=4, Hkv=2, D=16, L_max=512, starts=(0, 37, 300), Lq=5, L_new=5,
                 dtype=torch.float32):
        gen = torch.Generator().manual_seed(seed)
        self.starts = list(starts)
        self.q = randn(gen, B, Hq, Lq, D, dtype=dtype)
        self.k = randn(gen, B, Hkv, L_new, D, dtype=dtype) if L_new else None
        self.v = randn(gen, B, Hkv, L_new, D, dtype=dtype) if L_new else None
        self.k_cache = torch.full((B, Hkv, L_max, D), NAN, dtype=dtype)
        self.v_cache = torch.full((B, Hkv, L_max, D), NAN, dtype=dtype)
        for b, s in enumerate(self.starts):
            self.k_cache[b, :, :s] = randn(gen, Hkv, s, D, dtype=dtype)
            self.v_cache[b, :, :s] = randn(gen, Hkv, s, D, dtype=dtype)
        self.L_new = L_new

    @property
    def seqlens(self):
        return torch.tensor(self.starts, dtype=I32)

    def clone_caches(self):
        return self.k_cache.clone(), self.v_cache.clone()

    def paged(self, page_size, seed=1):
        """The same cache as pages in a shuffled pool (NaN in unused pages), and its page table (-1 padding)."""
        B, Hkv, L_max, D = self.k_cache.shape
        max_pages = math.ceil(L_max / page_size)
        need = [math.ceil((s + self.L_new) / page_size) for s in self.starts]
        pool = sum(need) + 3
        order = torch.randperm(pool, generator=torch.Generator().manual_seed(seed)).tolist()
        table = torch.full((B, max_pages), -1, dtype=I32)
        kp = torch.full((pool, Hkv, page_size, D), NAN, dtype=self.k_cache.dtype)
        vp = kp.clone()
        for b, n in enumerate(need):
            for j in range(n):
                page = order.pop()
                table[b, j] = page
                lo, hi = j * page_size, min((j + 1) * page_size, L_max)
                kp[page, :, : hi - lo] = self.k_cache[b, :, lo:hi]
                vp[page, :, : hi - lo] = self.v_cache[b, :, lo:hi]
        return kp, vp, table


def gather_paged(cache, table, length, b):
    ps = cache.shape[2]
    pos = torch.arange(length)
    return cache[table[b].long()[pos // ps], :, pos % ps].transpose(0, 1)


def shifted(mod, b0, score):
    if mod is None:
        return None
    return (lambda s, b, h, q, kv: mod(s, b + b0, h, q, kv)) if score else (lambda b, h, q, kv: mod(b + b0, h, q, kv))


def golden_sequence(attn, q, k, v, b0, q_offset):
    """float64 dense attention of one sequence (batch of one) with the mods seeing batch index b0."""
    sm, mm = reference64.mods_of(attn)
    return reference64.attention(q, k, v, score_mod=shifted(sm, b0, True), mask_mod=shifted(mm, b0, False),
                                 q_offset=q_offset)


# ---------------------------------------------------------------- paged == contiguous, append, RoPE

@pytest.mark.parametrize("page_size", [1, 16, 64, MAX_PAGE_SIZE])
def test_paged_equals_contiguous_bit_for_bit(page_size):
    case = Case()
    attn = attngen.compile(causal=True)
    cos, sin = rope_tables(512, 8)
    kp, vp, table = case.paged(page_size)
    kc, vc = case.clone_caches()
    common = dict(cache_seqlens=case.seqlens, rotary_cos=cos, rotary_sin=sin, return_lse=True)
    out_c, lse_c = attn.with_kvcache(case.q, kc, vc, case.k, case.v, **common)
    untouched = kp.clone(), vp.clone()
    out_p, lse_p = attn.with_kvcache(case.q, kp, vp, case.k, case.v, page_table=table, **common)
    assert same_bits(out_p, out_c) and same_bits(lse_p, lse_c)
    assert not out_c.isnan().any()
    written = torch.zeros(kp.shape[0], kp.shape[2], dtype=torch.bool)
    for b, s in enumerate(case.starts):
        n = s + case.L_new
        assert same_bits(gather_paged(kp, table, n, b), kc[b, :, :n])
        assert same_bits(gather_paged(vp, table, n, b), vc[b, :, :n])
        pos = torch.arange(s, n)
        written[table[b].long()[pos // page_size], pos % page_size] = True
    # everything but the appended slots keeps its bits (the NaN poison included)
    keep = ~written[:, None, :, None].expand_as(kp)
    assert same_bits(kp[keep], untouched[0][keep]) and same_bits(vp[keep], untouched[1][keep])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_append_and_rope_equal_pytorch_then_attention(interleaved, rotary_dim):
    case = Case(seed=2, starts=(3, 0, 20), L_max=40, Lq=4, L_new=4)
    attn = attngen.compile(window=9)
    cos, sin = rope_tables(64, rotary_dim)
    kc, vc = case.clone_caches()
    out, lse = attn.with_kvcache(case.q, kc, vc, case.k, case.v, cache_seqlens=case.seqlens, rotary_cos=cos,
                                 rotary_sin=sin, rotary_interleaved=interleaved, return_lse=True)
    for b, s in enumerate(case.starts):
        pos = torch.arange(s, s + case.L_new)
        k_expected = torch.cat((case.k_cache[b, :, :s], rope_by_hand(case.k[b], cos, sin, pos, interleaved)), dim=1)
        v_expected = torch.cat((case.v_cache[b, :, :s], case.v[b]), dim=1)
        assert same_bits(kc[b, :, : s + case.L_new], k_expected) and same_bits(vc[b, :, : s + case.L_new], v_expected)
        assert same_bits(kc[b, :, s + case.L_new:], case.k_cache[b, :, s + case.L_new:])  # NaN beyond: untouched
        q_rot = rope_by_hand(case.q[b], cos, sin, torch.arange(s, s + 4), interleaved)
        o, l = attngen.reference.attention(q_rot[None], k_expected[None], v_expected[None], attn, return_lse=True,
                                           q_offset=s)
        torch.testing.assert_close(out[b], o[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(lse[b], l[0], rtol=0, atol=1e-6)


def test_rotary_leaves_channels_past_rotary_dim_and_rotates_q_without_new_keys():
    case = Case(seed=3, starts=(6, 2, 9), L_max=12, Lq=2, L_new=0)
    cos, sin = rope_tables(16, 4)
    attn = attngen.compile()
    out = attn.with_kvcache(case.q, case.k_cache, case.v_cache, cache_seqlens=case.seqlens, rotary_cos=cos, rotary_sin=sin)
    for b, s in enumerate(case.starts):
        q_rot = rope_by_hand(case.q[b], cos, sin, torch.arange(s, s + 2), False)
        assert torch.equal(q_rot[..., 4:], case.q[b, ..., 4:])
        expected = attngen.reference.attention(q_rot[None], case.k_cache[b:b + 1, :, :s], case.v_cache[b:b + 1, :, :s])
        torch.testing.assert_close(out[b], expected[0], rtol=0, atol=1e-6)


# ---------------------------------------------------------------- lengths, rows, positions

def test_cache_seqlens_per_batch_and_as_int():
    case = Case(seed=4, starts=(7, 7, 7), L_max=16, L_new=2, Lq=2)
    attn = attngen.compile(causal=True)
    kc1, vc1 = case.clone_caches()
    kc2, vc2 = case.clone_caches()
    a = attn.with_kvcache(case.q, kc1, vc1, case.k, case.v, cache_seqlens=7)
    b = attn.with_kvcache(case.q, kc2, vc2, case.k, case.v, cache_seqlens=case.seqlens)
    assert same_bits(a, b) and same_bits(kc1, kc2) and same_bits(vc1, vc2)


def test_decode_without_new_keys_sees_the_whole_cache_under_causal():
    """k=None: query i of sequence b sits at s_b + i, past every cached key, so causal hides none of them."""
    case = Case(seed=5, starts=(4, 11, 1), L_max=16, L_new=0, Lq=1)
    causal, full = attngen.compile(causal=True), attngen.compile()
    kw = dict(cache_seqlens=case.seqlens)
    assert same_bits(causal.with_kvcache(case.q, case.k_cache, case.v_cache, **kw),
                     full.with_kvcache(case.q, case.k_cache, case.v_cache, **kw))


def test_no_cache_seqlens_means_full_caches():
    case = Case(seed=6, starts=(8, 8, 8), L_max=8, L_new=0, Lq=3)
    attn = attngen.compile(causal=True)
    out = attn.with_kvcache(case.q, case.k_cache, case.v_cache)
    assert same_bits(out, attngen.reference.attention(case.q, case.k_cache, case.v_cache, attn, q_offset=8))


def test_cache_batch_idx_selects_rows_and_writes_only_them():
    case = Case(seed=7, B=5, starts=(3, 9, 0, 5, 12), L_max=20, L_new=3, Lq=3)
    rows = torch.tensor([3, 0, 4], dtype=I32)
    attn = attngen.compile(causal=True)
    q, k, v = case.q[:3], case.k[:3], case.v[:3]
    lens = case.seqlens[rows.long()]
    kc, vc = case.clone_caches()
    out = attn.with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, cache_batch_idx=rows)
    k_sel, v_sel = case.k_cache[rows.long()].clone(), case.v_cache[rows.long()].clone()
    expected = attn.with_kvcache(q, k_sel, v_sel, k, v, cache_seqlens=lens)
    assert same_bits(out, expected)
    assert same_bits(kc[rows.long()], k_sel) and same_bits(vc[rows.long()], v_sel)
    for r in (1, 2):  # rows no sequence selected
        assert same_bits(kc[r], case.k_cache[r]) and same_bits(vc[r], case.v_cache[r])


def test_shared_prefix_pages_may_be_read_but_not_written_by_two_sequences():
    case = Case(seed=8, B=2, starts=(4, 4), L_max=16, L_new=1, Lq=1)
    kp, vp, table = case.paged(4)
    table[1, 0] = table[0, 0]  # both sequences read one prefix page
    attn = attngen.compile()
    attn.with_kvcache(case.q, kp, vp, cache_seqlens=case.seqlens, page_table=table)
    table[1, 1] = table[0, 1]  # and both would append into one page
    with pytest.raises(InputError, match="sequence 0 appends position 4 into a cache slot that sequence 1 also uses"):
        attn.with_kvcache(case.q, kp, vp, case.k, case.v, cache_seqlens=case.seqlens, page_table=table)


# ---------------------------------------------------------------- variants against float64

def _variants(B, Hq, npos, gen):
    doc_ids = torch.randint(0, 3, (B, npos), generator=gen).sort(dim=1).values.to(I32)

    def every_third_or_sink(b, h, q_idx, kv_idx):
        return ((q_idx - kv_idx) % 3 != 1) | (kv_idx == 0)

    return {
        "causal": attngen.compile(causal=True),
        "sliding_window": attngen.compile(window=6),
        "softcap": attngen.compile(softcap=2.0, causal=True),
        "alibi": attngen.compile(score_mod=attngen.alibi(Hq)),
        "document": attngen.compile(mask_mod=V.causal() & V.document(doc_ids)),
        "custom": attngen.compile(mask_mod=every_third_or_sink),
    }


VARIANTS = ["causal", "sliding_window", "softcap", "alibi", "document", "custom"]


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_variants_match_float64(name, paged):
    case = Case(seed=9, starts=(2, 13, 0), L_max=24, Lq=3, L_new=3, dtype=torch.float64)
    attn = _variants(3, 4, 24, torch.Generator().manual_seed(1))[name]
    cos, sin = rope_tables(24, 16, torch.float64)
    kc, vc = case.clone_caches()
    kw = dict(cache_seqlens=case.seqlens, rotary_cos=cos, rotary_sin=sin, return_lse=True)
    if paged:
        kc, vc, kw["page_table"] = case.paged(16)
    out, lse = attn.with_kvcache(case.q, kc, vc, case.k, case.v, **kw)
    for b, s in enumerate(case.starts):
        n = s + case.L_new
        q_rot = rope_by_hand(case.q[b], cos, sin, torch.arange(s, s + 3), False)
        k_rot = rope_by_hand(case.k[b], cos, sin, torch.arange(s, n), False)
        k_all = torch.cat((case.k_cache[b, :, :s], k_rot), 1)[None]
        v_all = torch.cat((case.v_cache[b, :, :s], case.v[b]), 1)[None]
        o, l = golden_sequence(attn, q_rot[None], k_all, v_all, b, s)
        torch.testing.assert_close(out[b], o[0], rtol=0, atol=1e-12)
        fin = torch.isfinite(l[0])
        assert torch.equal(fin, torch.isfinite(lse[b]))
        torch.testing.assert_close(lse[b][fin], l[0][fin], rtol=0, atol=1e-12)


def _packed(gen, n_q, n_k, Hq=4, Hkv=2, D=16, dtype=torch.float64):
    q = randn(gen, sum(n_q), Hq, D, dtype=dtype)
    k, v = randn(gen, sum(n_k), Hkv, D, dtype=dtype), randn(gen, sum(n_k), Hkv, D, dtype=dtype)
    cu = lambda n: torch.tensor([0] + torch.tensor(n).cumsum(0).tolist(), dtype=I32)  # noqa: E731
    return q, k, v, cu(n_q), cu(n_k)


@pytest.mark.parametrize("name", VARIANTS)
def test_varlen_variants_match_float64(name):
    n_q, n_k = [5, 1, 0, 7, 2], [5, 9, 3, 4, 0]  # equal, decode-like, no queries, more queries, no keys
    q, k, v, cu_q, cu_k = _packed(torch.Generator().manual_seed(10), n_q, n_k)
    attn = _variants(5, 4, 16, torch.Generator().manual_seed(2))[name]
    out, lse = attn.varlen(q, k, v, cu_q, cu_k, max_seqlen_q=7, max_seqlen_k=9, return_lse=True)
    assert out.shape == q.shape and lse.shape == (4, q.shape[0])
    assert (out[-2:] == 0).all() and torch.isneginf(lse[:, -2:]).all()  # the sequence without keys
    for b in range(5):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        t = lambda x: x.transpose(0, 1)[None]  # noqa: E731
        o, l = golden_sequence(attn, t(q[rq]), t(k[rk]), t(v[rk]), b, max(n_k[b] - n_q[b], 0))
        torch.testing.assert_close(out[rq], o[0].transpose(0, 1), rtol=0, atol=1e-12)
        fin = torch.isfinite(l[0])
        assert torch.equal(fin, torch.isfinite(lse[:, rq]))
        torch.testing.assert_close(lse[:, rq][fin], l[0][fin], rtol=0, atol=1e-12)


def test_varlen_equals_per_sequence_calls():
    n_q, n_k = [3, 8, 1], [3, 12, 6]
    q, k, v, cu_q, cu_k = _packed(torch.Generator().manual_seed(11), n_q, n_k, dtype=torch.float32)
    attn = attngen.compile(softcap=5.0, window=4)
    out, lse = attn.varlen(q, k, v, cu_q, cu_k, return_lse=True)
    for b in range(3):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        o, l = attn(q[rq].transpose(0, 1)[None], k[rk].transpose(0, 1)[None], v[rk].transpose(0, 1)[None],
                    return_lse=True, q_offset=n_k[b] - n_q[b])
        assert same_bits(out[rq], o[0].transpose(0, 1).contiguous()) and same_bits(lse[:, rq], l[0])


def test_varlen_seqused_k_drops_the_padding_and_aligns_to_the_used_keys():
    n_q, n_k = [2, 3], [8, 6]
    q, k, v, cu_q, cu_k = _packed(torch.Generator().manual_seed(12), n_q, n_k, dtype=torch.float32)
    used = torch.tensor([5, 6], dtype=I32)
    k[5:8] = NAN  # sequence 0's padding rows: never read
    v[5:8] = NAN
    attn = attngen.compile(causal=True)
    out = attn.varlen(q, k, v, cu_q, cu_k, seqused_k=used)
    keep = torch.tensor([0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13])
    expected = attn.varlen(q, k[keep], v[keep], cu_q, torch.tensor([0, 5, 11], dtype=I32))
    assert same_bits(out, expected)


# ---------------------------------------------------------------- errors

def _kv_call(**change):
    """with_kvcache arguments on a small valid paged or contiguous case, with `change` applied."""
    case = Case(seed=13, B=2, starts=(3, 5), L_max=8, Lq=1, L_new=1)
    cos, sin = rope_tables(16, 8)
    args = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, k=case.k, v=case.v, cache_seqlens=case.seqlens,
                rotary_cos=cos, rotary_sin=sin)
    if change.pop("paged", False):
        args["k_cache"], args["v_cache"], args["page_table"] = case.paged(4)
    args.update(change)
    return args


T = torch.zeros
KV_ERRORS = {
    "q rank": (dict(q=T(2, 4, 16)), "q must be 4-D"),
    "q dtype": (dict(q=T(2, 4, 1, 16, dtype=torch.int64)), "q must be floating point"),
    "k without v": (dict(v=None), "k and v .* come together"),
    "cache rank": (dict(k_cache=T(2, 2, 8)), "k_cache must be 4-D"),
    "cache dtype": (dict(v_cache=T(2, 2, 8, 16, dtype=torch.float64)), "v_cache must have q's dtype"),
    "cache shapes": (dict(v_cache=T(2, 2, 9, 16)), "k_cache and v_cache must agree"),
    "head dim": (dict(k_cache=T(2, 2, 8, 32), v_cache=T(2, 2, 8, 32)), "k_cache head dim 32 differs"),
    "gqa": (dict(k_cache=T(2, 3, 8, 16), v_cache=T(2, 3, 8, 16)), "multiple of the cache's kv heads"),
    "new k shape": (dict(k=T(2, 2, 1, 8)), r"k must have shape \(B, Hkv, L_new, D\)"),
    "cache rows": (dict(k_cache=T(3, 2, 8, 16), v_cache=T(3, 2, 8, 16)), "pass cache_batch_idx"),
    "batch idx dtype": (dict(cache_batch_idx=torch.tensor([0, 1])), "cache_batch_idx must have dtype torch.int32"),
    "batch idx range": (dict(cache_batch_idx=torch.tensor([0, 2], dtype=I32)), r"cache_batch_idx\[1\] = 2 is outside"),
    "batch idx shape": (dict(cache_batch_idx=torch.tensor([0], dtype=I32)), "one entry per sequence"),
    "shared row": (dict(cache_batch_idx=torch.tensor([1, 1], dtype=I32)), "also uses in this call"),
    "seqlens missing": (dict(cache_seqlens=None), "appending k/v needs cache_seqlens"),
    "seqlens dtype": (dict(cache_seqlens=torch.tensor([3, 5])), "cache_seqlens must have dtype torch.int32"),
    "seqlens shape": (dict(cache_seqlens=torch.tensor([3], dtype=I32)), "cache_seqlens must have one entry"),
    "seqlens negative": (dict(cache_seqlens=torch.tensor([3, -1], dtype=I32)), r"cache_seqlens\[1\] = -1 is negative"),
    "seqlens int": (dict(cache_seqlens=-2), "cache_seqlens must be an int >= 0"),
    "over capacity": (dict(cache_seqlens=torch.tensor([3, 8], dtype=I32)), "over the cache's capacity of 8"),
    "rotary half": (dict(rotary_sin=None), "rotary_cos and rotary_sin come together"),
    "rotary shape": (dict(rotary_cos=T(16, 4, 1), rotary_sin=T(16, 4, 1)), "rotary_cos must be 2-D"),
    "rotary dtype": (dict(rotary_cos=T(16, 4, dtype=torch.float64), rotary_sin=T(16, 4, dtype=torch.float64)),
                     "rotary_cos must have q's dtype"),
    "rotary mismatch": (dict(rotary_sin=T(16, 2)), "must have one shape"),
    "rotary dim": (dict(rotary_cos=T(16, 9), rotary_sin=T(16, 9)), "rotary_dim = 18, more than the head dim 16"),
    "rotary rows": (dict(rotary_cos=T(5, 4), rotary_sin=T(5, 4)), "needs position 5"),
    "interleaved": (dict(rotary_interleaved=1), "rotary_interleaved must be a bool"),
    "num_splits": (dict(num_splits=-1), "num_splits must be an int >= 0"),
    "return_lse": (dict(return_lse="yes"), "return_lse must be a bool"),
    "scale": (dict(scale="big"), "scale must be a number"),
    "paged + batch idx": (dict(paged=True, cache_batch_idx=torch.tensor([0, 1], dtype=I32)),
                          "cache_batch_idx does not apply to a paged cache"),
    "page table dtype": (dict(paged=True, page_table=T(2, 2, dtype=torch.int64)), "page_table must have dtype"),
    "page table rows": (dict(paged=True, page_table=T(3, 2, dtype=I32)), "page_table must have one row per sequence"),
    "page size": (dict(paged=True, k_cache=T(4, 2, 257, 16), v_cache=T(4, 2, 257, 16)), "page_size .* must be 1 to 256"),
    "page range": (dict(paged=True, page_table=torch.tensor([[0, 1], [2, 9]], dtype=I32)),
                   r"page_table\[1, 1\] = 9 is not a page of the cache"),
    "page capacity": (dict(paged=True, page_table=torch.tensor([[0], [2]], dtype=I32)), "capacity of 4"),
    "page twice": (dict(paged=True, page_table=torch.tensor([[0, 1], [2, 2]], dtype=I32)),
                   r"page_table\[1, 0\] and page_table\[1, 1\] are both page 2"),
}


@pytest.mark.parametrize("name", list(KV_ERRORS))
def test_with_kvcache_errors_name_the_fix_and_write_nothing(name):
    change, message = KV_ERRORS[name]
    args = _kv_call(**change)
    before = [t.clone() for t in (args["k_cache"], args["v_cache"])]
    with pytest.raises(InputError, match=message):
        attngen.compile().with_kvcache(**args)
    assert all(same_bits(t, b) for t, b in zip((args["k_cache"], args["v_cache"]), before) if t.shape == b.shape)


@pytest.mark.parametrize("paged", [False, True])
def test_a_captured_tensor_too_short_for_one_sequence_writes_nothing(paged):
    """doc_ids covers positions 0..4: sequence 0 (3 cached keys + 1 new) fits, sequence 1 (5 + 1) does not. The
    check runs for every sequence before the appends."""
    args = _kv_call(paged=paged)
    before = [t.clone() for t in (args["k_cache"], args["v_cache"])]
    attn = attngen.compile(mask_mod=V.document(torch.zeros(2, 5, dtype=I32)))
    with pytest.raises(InputError, match="captured tensor .* reaches 5 at this call"):
        attn.with_kvcache(**args)
    assert all(same_bits(t, b) for t, b in zip((args["k_cache"], args["v_cache"]), before))


def _varlen_call(**change):
    q, k, v, cu_q, cu_k = _packed(torch.Generator().manual_seed(14), [2, 3], [4, 3], dtype=torch.float32)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    args.update(change)
    return args


VARLEN_ERRORS = {
    "q rank": (dict(q=T(1, 5, 4, 16)), "q must be 3-D packed"),
    "k dtype": (dict(k=T(7, 2, 16, dtype=torch.float64)), "must share one dtype and device"),
    "v heads": (dict(v=T(7, 1, 16)), "k and v must agree"),
    "head dim": (dict(k=T(7, 2, 8), v=T(7, 2, 8)), "k head dim 8 differs"),
    "gqa": (dict(k=T(7, 3, 16), v=T(7, 3, 16)), "multiple of kv heads"),
    "cu dtype": (dict(cu_seqlens_q=torch.tensor([0, 2, 5])), "cu_seqlens_q must have dtype torch.int32"),
    "cu empty": (dict(cu_seqlens_q=torch.tensor([], dtype=I32)), "B \\+ 1 >= 1 entries"),
    "cu start": (dict(cu_seqlens_k=torch.tensor([1, 4, 7], dtype=I32)), r"cu_seqlens_k\[0\] must be 0"),
    "cu order": (dict(cu_seqlens_q=torch.tensor([0, 3, 2, 5], dtype=I32)), "must be non-decreasing"),
    "cu total": (dict(cu_seqlens_k=torch.tensor([0, 4, 6], dtype=I32)), r"cu_seqlens_k\[-1\] = 6 but the packed"),
    "cu counts": (dict(cu_seqlens_k=torch.tensor([0, 7], dtype=I32)), "the same number of sequences"),
    "max q": (dict(max_seqlen_q=2), "max_seqlen_q = 2 but a sequence has 3 rows"),
    "max k type": (dict(max_seqlen_k=4.0), "max_seqlen_k must be an int"),
    "seqused dtype": (dict(seqused_k=torch.tensor([4, 3])), "seqused_k must have dtype torch.int32"),
    "seqused shape": (dict(seqused_k=torch.tensor([4], dtype=I32)), "seqused_k must have one entry per sequence"),
    "seqused range": (dict(seqused_k=torch.tensor([5, 3], dtype=I32)), r"seqused_k\[0\] = 5 but sequence 0 has 4"),
    "return_lse": (dict(return_lse=None), "return_lse must be a bool"),
}


@pytest.mark.parametrize("name", list(VARLEN_ERRORS))
def test_varlen_errors_name_the_fix(name):
    change, message = VARLEN_ERRORS[name]
    with pytest.raises(InputError, match=message):
        attngen.compile(causal=True).varlen(**_varlen_call(**change))


def test_varlen_kernel_path_refuses_what_a_batch_of_one_cannot_do(monkeypatch):
    """The per-sequence kernel path (CUDA tensors) shows each sequence to the kernel as batch 0: a variant that
    reads b is refused with the fix, and so is graph capture (the lengths are read on the host)."""
    from attngen.varlen import _check_kernel_path

    def per_seq_bias(s, b, h, q, kv):
        return s + b * 0.5

    with pytest.raises(GpuPathNotAvailable, match="reads b .* backend='reference'"):
        _check_kernel_path(attngen.compile(score_mod=per_seq_bias))
    _check_kernel_path(attngen.compile(causal=True, window=8))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(InputError, match="cannot be captured in a CUDA graph"):
        _check_kernel_path(attngen.compile(causal=True))
    assert issubclass(GpuPathNotAvailable, (attngen.AttngenError, NotImplementedError))


def test_outputs_are_not_differentiable_and_the_cache_may_require_grad():
    case = Case(seed=15, B=1, starts=(2,), L_max=4, Lq=1, L_new=1)
    kc, vc = (t.clone().requires_grad_() for t in case.clone_caches())
    out = attngen.compile().with_kvcache(case.q.requires_grad_(), kc, vc, case.k, case.v, cache_seqlens=2)
    assert not out.requires_grad and same_bits(kc.detach()[0, :, 2:3], case.k[0])


# ------------------------------------------------------------------------------------------------------------------
# the CUDA path (kvcache._with_kvcache_kernel) up to the launch, on CPU tensors: the decode launch replaced by a
# recorder, the graph-capture query by a switch


@pytest.fixture
def kernel_path(monkeypatch):
    """(run, launches): run(attn, **kwargs) calls the kernel path with the launch recorded in ``launches``; the
    ``capturing`` kwarg says what torch.cuda.is_current_stream_capturing answers."""
    import attngen.decode
    import attngen.kvcache as kv

    launches = []

    def fake_decode(lib, q, k_cache, v_cache, **kw):
        launches.append(dict(q=q.clone(), k_cache=k_cache.clone(), v_cache=v_cache.clone(), **kw))
        return torch.zeros_like(q)

    monkeypatch.setattr(attngen.decode, "decode", fake_decode)

    def run(attn, capturing=False, **kwargs):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
        monkeypatch.setattr(type(attn), "decode_library", lambda self, *a: None)
        args = dict(k=None, v=None, cache_seqlens=None, page_table=None, rotary_cos=None, rotary_sin=None,
                    rotary_interleaved=False, cache_batch_idx=None, num_splits=0, return_lse=False, scale=None)
        args.update(kwargs)
        return kv._with_kvcache_kernel(attn, args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("k"),
                                       args.pop("v"), args.pop("cache_seqlens"), args.pop("page_table"),
                                       args.pop("rotary_cos"), args.pop("rotary_sin"), args.pop("rotary_interleaved"),
                                       args.pop("cache_batch_idx"), args.pop("num_splits"), args.pop("return_lse"),
                                       args.pop("scale"))

    return run, launches


@pytest.mark.parametrize("layout", ["contiguous", "rows", "paged"])
def test_kernel_path_appends_and_rotates_as_the_reference(kernel_path, layout):
    run, launches = kernel_path
    gen = torch.Generator().manual_seed(5)
    B, Hq, Hkv, D, L, Ln, ps = 3, 4, 2, 64, 48, 3, 16
    bf = torch.bfloat16
    q, k, v = (randn(gen, B, h, n, D, dtype=bf) for h, n in ((Hq, 2), (Hkv, Ln), (Hkv, Ln)))
    lens = torch.tensor([0, 17, L - Ln], dtype=I32)
    cos, sin = rope_tables(L + 4, 32, dtype=bf)
    kw = dict(cache_seqlens=lens, rotary_cos=cos, rotary_sin=sin)
    if layout == "paged":
        kc = randn(gen, B * L // ps, Hkv, ps, D, dtype=bf)
        kw["page_table"] = torch.randperm(B * L // ps, generator=gen).view(B, L // ps).to(I32)
    else:
        kc = randn(gen, B + 2 if layout == "rows" else B, Hkv, L, D, dtype=bf)
        if layout == "rows":
            kw["cache_batch_idx"] = torch.tensor([4, 0, 2], dtype=I32)
    vc = randn(gen, *kc.shape, dtype=bf)
    want_k, want_v = kc.clone(), vc.clone()
    attngen.compile(causal=True, backend="reference").with_kvcache(q, want_k, want_v, k, v, **kw)
    attn = attngen.compile(causal=True)
    run(attn, q=q, k_cache=kc, v_cache=vc, k=k, v=v, **kw)
    (launch,) = launches
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)  # the same slots written with the same bits
    positions = lens.long()[:, None] + torch.arange(2)  # the queries rotated at s_b + i
    from attngen.rotary import apply_rotary

    assert torch.equal(launch["q"], apply_rotary(q, cos, sin, positions.unsqueeze(1), False))
    assert torch.equal(launch["seqlens"], lens) and launch["kv_extra"] == Ln
    assert launch["cache_batch_idx"] is None if layout != "rows" else torch.equal(launch["cache_batch_idx"],
                                                                                 kw["cache_batch_idx"])


def test_kernel_path_checks_values_eagerly_and_clamps_under_capture(kernel_path):
    run, launches = kernel_path
    gen = torch.Generator().manual_seed(6)
    bf = torch.bfloat16
    q, k, v = (randn(gen, 2, h, 1, 64, dtype=bf) for h in (4, 2, 2))
    kc = randn(gen, 4, 2, 16, 64, dtype=bf)
    vc = randn(gen, *kc.shape, dtype=bf)
    table = torch.tensor([[0, 9], [1, 2]], dtype=I32)  # page 9 is not in the cache
    lens = torch.tensor([20, 3], dtype=I32)
    before = kc.clone()
    with pytest.raises(InputError, match="not a page"):
        run(attngen.compile(causal=True), q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=lens, page_table=table)
    assert torch.equal(kc, before) and not launches  # nothing written, nothing launched
    with pytest.raises(InputError, match="capacity"):  # 31 + 1 keys in a 32-slot row
        run(attngen.compile(causal=True), q=q, k_cache=kc, v_cache=vc, k=k, v=v, page_table=table[:, :1] * 0 + 3,
            cache_seqlens=torch.tensor([16, 3], dtype=I32))
    # under capture no value is read: the bad page is clamped into the cache (page 3), the launch still happens
    run(attngen.compile(causal=True), capturing=True, q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=lens,
        page_table=table)
    assert len(launches) == 1
    changed = (kc != before).flatten(1).any(1)
    assert changed.tolist() == [False, True, False, True]  # sequence 1's slot in page 1, sequence 0's clamped page 3


def test_kernel_path_under_capture_needs_tables_for_the_whole_cache(kernel_path):
    """Under capture the lengths are on the device: rotary tables shorter than the cache's positions would be
    clamped to their last row, so the call refuses them; tables covering the capacity run."""
    run, launches = kernel_path
    gen = torch.Generator().manual_seed(7)
    bf = torch.bfloat16
    q, k, v = (randn(gen, 2, h, 1, 64, dtype=bf) for h in (4, 2, 2))
    kc, vc = randn(gen, 2, 2, 40, 64, dtype=bf), randn(gen, 2, 2, 40, 64, dtype=bf)
    lens = torch.tensor([5, 7], dtype=I32)
    short = rope_tables(16, 32, dtype=bf)  # enough for these lengths: eager calls run
    run(attngen.compile(causal=True), q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=lens,
        rotary_cos=short[0], rotary_sin=short[1])
    with pytest.raises(InputError, match="cover every position the cache can hold \\(40"):
        run(attngen.compile(causal=True), capturing=True, q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=lens,
            rotary_cos=short[0], rotary_sin=short[1])
    assert len(launches) == 1
    full = rope_tables(40, 32, dtype=bf)
    run(attngen.compile(causal=True), capturing=True, q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=lens,
        rotary_cos=full[0], rotary_sin=full[1])
    assert len(launches) == 2


def test_shared_write_check_agrees_with_slot_by_slot():
    """kvcache._check_no_shared_writes works block by block; on random paged and row-selected caches with shared
    blocks it raises exactly when, and for the same (sequence, position, other sequence) as, a slot-by-slot scan."""
    from attngen.kvcache import _check_no_shared_writes, _contiguous_layout, _paged_layout

    def brute(locate, starts, L_new, U):
        def slot_of(b, positions):
            major, minor = locate(b, positions)
            return major * U + minor

        slots = [set(slot_of(b, torch.arange(s + L_new)).tolist()) for b, s in enumerate(starts)]
        for b, s in enumerate(starts):
            for pos in range(s, s + L_new):
                slot = int(slot_of(b, torch.tensor([pos])))
                others = [o for o in range(len(starts)) if o != b and slot in slots[o]]
                if others:
                    return b, pos, others[0]
        return None

    gen = torch.Generator().manual_seed(5)
    cpu = torch.device("cpu")
    raised = 0
    for trial in range(200):
        B, U, L_new = 3, int(torch.randint(1, 5, (1,), generator=gen)), int(torch.randint(1, 4, (1,), generator=gen))
        starts = torch.randint(0, 3 * U, (B,), generator=gen).tolist()
        if trial % 2:  # pages drawn from a small pool: some shared across sequences (never twice in one row)
            pages = -(-(max(starts) + L_new) // U)
            table = torch.stack([torch.randperm(2 * pages, generator=gen)[:pages] for _ in range(B)]).int()
            locate, _ = _paged_layout(B, cpu, torch.zeros(2 * pages, 1, U, 1), table, None)
            unit = U
        else:  # cache rows chosen per sequence, some chosen twice
            rows = torch.randint(0, B, (B,), generator=gen).int()
            k_cache = torch.zeros(B, 1, 3 * U + L_new, 1)
            locate, unit = _contiguous_layout(B, cpu, k_cache, rows)
        want = brute(locate, starts, L_new, unit)
        if want is None:
            _check_no_shared_writes(locate, starts, L_new, unit, cpu)
        else:
            raised += 1
            b, pos, other = want
            with pytest.raises(InputError, match=f"sequence {b} appends position {pos} into a cache slot that "
                                                 f"sequence {other} also uses"):
                _check_no_shared_writes(locate, starts, L_new, unit, cpu)
    assert 20 < raised < 180  # both outcomes drawn often
