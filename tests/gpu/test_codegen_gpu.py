"""attngen.codegen.render_variant_inc on the GPU: the device paths of the hand-built variant.inc cases
(tests/codegen_cases.py; tanh.approx, ex2.approx, __ldg loads, fp16/bf16 conversion) compute on real hardware
what Python computes (attngen.printer's torch evaluator), elements and tile functions alike."""
import ctypes
import os
import random
import subprocess

import pytest
import sympy
import torch

from attngen.codegen import render_variant_inc
from attngen.symbols import B, BK, BQ, H, I, J, KV, KVLEN, Q, QLEN, QOFF, SCORE

from codegen_cases import MATH as _MATH
from codegen_cases import UNDEF as _UNDEF
from codegen_cases import make_tensors, variants
from codegen_cases import py_eval as _py
from codegen_cases import write_includes as _write_includes


class _CapturedArgsC(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p * 8), ("stride", (ctypes.c_longlong * 4) * 8), ("summary", ctypes.c_void_p * 8)]


@pytest.mark.requires_gpu
def test_variant_inc_on_gpu_matches_python(tmp_path, nvcc_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    tensors = make_tensors(seed)
    V = variants(tensors)
    maj, mnr = torch.cuda.get_device_capability()
    arch = f"{maj}{mnr}" + ("a" if maj == 9 else "")
    inc = _write_includes(tmp_path, {k: render_variant_inc(t, p) for k, (t, p) in V.items()})
    BQ_, BK_ = 64, 128
    parts = ['#include "attngen_common.cuh"', _MATH]
    for k in V:
        parts.append(f"namespace v_{k} {{\n#include \"{k}.inc\"\n" + f"""
__global__ void elem(CapturedArgs c, TileArgs t, const float* S, float* out_s, int* out_m) {{
  const HeadCtx hc = head_ctx(c, t.b, t.h);
  const int r = blockIdx.x, q = r + t.QOFF;
  const RowCtx rc = row_ctx(c, hc, q);
  for (int k = threadIdx.x; k < t.KVLEN; k += blockDim.x) {{
    const ColCtx cc = col_ctx(c, hc, k);
    out_s[r * t.KVLEN + k] = score_mod(S[r * t.KVLEN + k], c, hc, rc, cc, q, k);
    out_m[r * t.KVLEN + k] = mask_mod(c, hc, rc, cc, q, k);
  }}
}}
__global__ void tiles(CapturedArgs c, TileArgs t, int nqb, int nkb, int* out) {{
  const int i = blockIdx.x, j = threadIdx.x;
  if (j < nkb) out[(i * nkb + j) * 2] = tile_any<{BQ_}, {BK_}>(c, t, i, j), out[(i * nkb + j) * 2 + 1] = tile_all<{BQ_}, {BK_}>(c, t, i, j);
  if (j == 0) {{
    int* o = out + nqb * nkb * 2 + i * 4;
    o[0] = kv_block_lo<{BQ_}, {BK_}>(c, t, i); o[1] = kv_block_hi<{BQ_}, {BK_}>(c, t, i);
    o[2] = kv_full_lo<{BQ_}, {BK_}>(c, t, i); o[3] = kv_full_hi<{BQ_}, {BK_}>(c, t, i);
  }}
}}
}}  // namespace
extern "C" int run_{k}(const CapturedArgs* c, const TileArgs* t, const float* S, float* out_s, int* out_m, int nqb, int nkb, int* out_t) {{
  v_{k}::elem<<<t->QLEN, 128>>>(*c, *t, S, out_s, out_m);
  v_{k}::tiles<<<nqb, nkb < 1 ? 1 : nkb>>>(*c, *t, nqb, nkb, out_t);
  cudaError_t e = cudaDeviceSynchronize();
  return e == cudaSuccess ? (int)cudaGetLastError() : (int)e;
}}
""" + _UNDEF)
    (tmp_path / "gpu.cu").write_text("\n".join(parts))
    lib = tmp_path / "gpu.so"
    r = subprocess.run([nvcc_path, "-std=c++17", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-shared",
                        "-Xcompiler", "-fPIC", *inc, "-o", str(lib), str(tmp_path / "gpu.cu")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:8000]
    so = ctypes.CDLL(str(lib))

    QLEN_, KVLEN_, QOFF_ = 100, 200, rng.randint(0, 100)
    b_, h_ = rng.randint(0, 1), rng.randint(0, 3)
    nqb, nkb = -(-QLEN_ // BQ_), -(-KVLEN_ // BK_)
    dev = torch.device("cuda")
    summaries = {f"s{n}": torch.randint(0, 6, (8,), dtype=torch.int32) for n in range(4)}
    scores = (torch.randn(QLEN_, KVLEN_, dtype=torch.float64) * 20).to(torch.float32)
    q = torch.arange(QLEN_)[:, None] + QOFF_
    kv = torch.arange(KVLEN_)[None, :]
    for k, (tv, preds) in V.items():
        keep = []  # device tensors must outlive the call
        c = _CapturedArgsC()
        for n, ct in enumerate(tv.captured):
            d = ct.tensor.to(dev)  # .to keeps the (non-contiguous) strides of a dense view
            keep.append(d)
            c.ptr[n] = d.data_ptr()
            for dd, st in enumerate(d.stride()):
                c.stride[n][dd] = st
        for n, s in enumerate(preds.summaries):
            d = summaries[s.name].to(dev)
            keep.append(d)
            c.summary[n] = d.data_ptr()
        t = (ctypes.c_int * 5)(QLEN_, KVLEN_, QOFF_, b_, h_)
        S = scores.to(dev)
        out_s = torch.full((QLEN_, KVLEN_), float("nan"), device=dev)
        out_m = torch.full((QLEN_, KVLEN_), -7, dtype=torch.int32, device=dev)
        out_t = torch.full((nqb * nkb * 2 + nqb * 4,), -7, dtype=torch.int32, device=dev)
        err = getattr(so, f"run_{k}")(ctypes.byref(c), t, ctypes.c_void_p(S.data_ptr()), ctypes.c_void_p(out_s.data_ptr()),
                                      ctypes.c_void_p(out_m.data_ptr()), nqb, nkb, ctypes.c_void_p(out_t.data_ptr()))
        assert err == 0, f"{k}: CUDA error {err}"
        caps = {ct.name: ct.tensor for ct in tv.captured}
        want_s = torch.broadcast_to(torch.as_tensor(
            _py(tv.score, [SCORE, B, H, Q, KV], caps, scores.to(torch.float64), b_, h_, q, kv), dtype=torch.float64), (QLEN_, KVLEN_))
        want_m = torch.broadcast_to(torch.as_tensor(_py(tv.mask, [B, H, Q, KV], caps, b_, h_, q, kv)), (QLEN_, KVLEN_))
        assert torch.equal(out_m.cpu().bool(), want_m.bool()), f"seed {seed}: {k}: mask_mod differs on the GPU"
        # tanh.approx.f32 has ~2^-11 relative error: softcap(30) may be off by 30 * 2^-11 at most;
        # everything else (ex2.approx included) is within a few fp32 ulps
        rtol, atol = (2e-3, 2e-2) if tv.score.has(sympy.tanh) else (1e-5, 1e-4)
        torch.testing.assert_close(out_s.cpu().double(), want_s, rtol=rtol, atol=atol,
                                   msg=lambda m: f"seed {seed}: {k}: score_mod on the GPU: {m}")
        ot = out_t.cpu()
        tile = ot[: nqb * nkb * 2].reshape(nqb, nkb, 2)
        bounds = ot[nqb * nkb * 2:].reshape(nqb, 4)
        tile_args, tile_vals = (BQ, BK, QLEN, KVLEN, QOFF, B, H), (BQ_, BK_, QLEN_, KVLEN_, QOFF_, b_, h_)
        i, j = torch.arange(nqb), torch.arange(nkb)
        for col, e in enumerate((preds.tile_any, preds.tile_all)):
            want = torch.broadcast_to(torch.as_tensor(_py(e, (I, J) + tile_args, summaries, i[:, None], j[None, :], *tile_vals)), (nqb, nkb))
            assert tile[..., col].bool().tolist() == want.bool().tolist(), f"seed {seed}: {k}: {e}"
        for col, e in enumerate((preds.kv_lo, preds.kv_hi, preds.kv_full_lo, preds.kv_full_hi)):
            want = torch.broadcast_to(torch.as_tensor(_py(e, (I,) + tile_args, summaries, i, *tile_vals)), (nqb,))
            assert bounds[:, col].tolist() == want.tolist(), f"seed {seed}: {k}: {e}"
