"""The cost of not specialising (issue 14, runtime parameters): each library anchor built twice, once with its
numbers as kernel arguments (the default) and once with them baked in (`specialize=True`), timed side by side in
interleaved rounds (B=2, H=16, S=8192, D=128 bf16; triton's do_bench median per round, the median of the rounds)
and checked against each other. Needs a GPU.
Usage: python scripts/specialize_ab.py [--rounds 3] [--S 8192] [--out DIR]"""
import argparse
import concurrent.futures as cf
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
import triton.testing  # noqa: E402

import attngen  # noqa: E402
from bench_forward import heat_gpu  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--S", type=int, default=8192)
p.add_argument("--out", default=None, help="write specialize_ab.md here")
args = p.parse_args()

V = attngen.variants


def cases(sp):
    kw = {"specialize": True} if sp else {}
    return {
        "sliding_window(1024)": dict(mask_mod=V.sliding_window(1024, **kw)),
        "softcap(30)": dict(score_mod=V.softcap(30, **kw)),
        "softcap(30) + causal": dict(score_mod=V.softcap(30, **kw), mask_mod=V.causal()),
        "alibi(16) + causal": dict(score_mod=V.alibi(16, **kw), mask_mod=V.causal()),
        "prefix_lm(2048)": dict(mask_mod=V.prefix_lm(2048, **kw)),
        "chunked(1024)": dict(mask_mod=V.chunked(1024, **kw)),
        "dilated(1024, 2)": dict(mask_mod=V.dilated(1024, 2, **kw)),
    }


B, H, S, D = 2, 16, args.S, 128
runtime, special = cases(False), cases(True)
attns = {(n, sp): attngen.compile(**kw) for sp, cs in ((False, runtime), (True, special)) for n, kw in cs.items()}
with cf.ThreadPoolExecutor(8) as ex:  # build everything at once
    for f in [ex.submit(lambda a: a.spec(torch.bfloat16, D).build_cached(), a) for a in attns.values()]:
        f.result()
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
heat_gpu("cuda")
times = {key: [] for key in attns}
for _ in range(args.rounds):
    for key, a in attns.items():
        times[key].append(triton.testing.do_bench(lambda a=a: a(q, k, v), warmup=50, rep=200))
rows = ["| variant | runtime ms | specialised ms | runtime / specialised | max abs diff |", "|---|---|---|---|---|"]
for n in runtime:
    rt, sp = (statistics.median(times[(n, s)]) for s in (False, True))
    diff = (attns[(n, False)](q, k, v).float() - attns[(n, True)](q, k, v).float()).abs().max().item()
    rows.append(f"| {n} | {rt:.3f} | {sp:.3f} | {rt / sp:.3f} | {diff:.2e} |")
text = (f"B={B} H={H} S={S} D={D} bf16, {torch.cuda.get_device_name()}, torch {torch.__version__}; "
        f"median of {args.rounds} interleaved rounds\n\n" + "\n".join(rows) + "\n")
print(text)
if args.out:
    Path(args.out, "specialize_ab.md").write_text(text)
