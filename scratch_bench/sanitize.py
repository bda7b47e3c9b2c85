# temporary: small cases to run under compute-sanitizer (not part of the repo)
import os, sys, torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
import test_kernel_gpu as T
from attngen import build, runtime
arch = build.current_arch()
bd = "/tmp/san_build"
srcs = {}
for name in ["causal", "alibi_doc", "bias2d_pad"]:
    for hd in [64, 128, 256]:
        s = build.render_sources(open(f"tests/data/{name}.inc").read(), torch.bfloat16, hd, arch)
        d = f"{name}_bfloat16_{hd}"
        srcs[f"{d}/attngen_fwd.cu"] = s.pop("attngen_fwd.cu"); srcs[f"{d}/variant.inc"] = s.pop("variant.inc"); srcs.update(s)
build.write_build_ninja(bd, srcs, arch)
build.run_ninja(bd, jobs=os.cpu_count())
libs = lambda n, dt, hd: runtime.load_library(f"{bd}/{n}_bfloat16_{hd}/libattngen_fwd.so")
cases = []
for hd in [64, 128, 256]:
    cases += [("causal", hd, dict(B=1, Hq=2, Hkv=1, Lq=200, Lk=333, q_offset=-20)),
              ("alibi_doc", hd, dict(B=1, Hq=2, Hkv=2, Lq=300, Lk=400, q_offset=100, seed=3)),
              ("alibi_doc", hd, dict(B=1, Hq=1, Hkv=1, Lq=90, Lk=170, q_offset=170, all_masked=True)),
              ("bias2d_pad", hd, dict(B=1, Hq=2, Hkv=1, Lq=77, Lk=150, q_offset=5))]
only = os.environ.get("CASES")
for n, (name, hd, kw) in enumerate(cases):
    if only and str(n) not in only.split(","):
        continue
    print(f"CASE {n}: {name} hd{hd} {kw}", flush=True)
    try:
        T.run_case(libs, name, torch.bfloat16, hd, **kw)
        print(f"CASE {n} ok", flush=True)
    except Exception as e:
        print(f"CASE {n} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
        raise
print("SANITIZE CASES DONE")
