# temporary tile-config benchmark (not part of the repo)
import os, sys, time, torch, math, re
sys.path.insert(0, os.getcwd())
from attngen import build, runtime
from attngen.build import TileConfig
arch = build.current_arch()
CONFIGS = {64: [(128,64,4),(128,32,4),(64,64,4)],
           128: [(128,32,4),(64,64,4)],
           256: [(128,64,8),(64,32,4)]}
srcs = {}
for hd, cfgs in CONFIGS.items():
    for (bq,bk,w) in cfgs:
        for name in ["full","causal","alibi_doc","bias2d_pad"]:
            s = build.render_sources(open(f"tests/data/{name}.inc").read(), torch.bfloat16, hd, arch, tiles=TileConfig(bq,bk,w))
            d = f"{name}_{hd}_{bq}x{bk}w{w}"
            srcs[f"{d}/attngen_fwd.cu"] = s.pop("attngen_fwd.cu"); srcs[f"{d}/variant.inc"] = s.pop("variant.inc"); srcs.update(s)
bd = "/tmp/bench_build"
build.write_build_ninja(bd, srcs, arch, ["-Xptxas","-v"])
t=time.time(); out = build.run_ninja(bd, jobs=os.cpu_count()); print("build s", time.time()-t, flush=True)
regs = {}
cur=None
for line in out.splitlines():
    m = re.search(r'NVCC (\S+)/attngen_fwd.o', line)
    if m: cur=m.group(1)
    m = re.search(r'Used (\d+) registers', line)
    if m: regs[cur]=m.group(1)
    m = re.search(r'(\d+) bytes spill stores', line)
    if m and m.group(1)!='0': regs[cur+'_spill']=m.group(1)

def bench(fn, iters=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    st = torch.cuda.Event(enable_timing=True); en = torch.cuda.Event(enable_timing=True)
    st.record()
    for _ in range(iters): fn()
    en.record(); torch.cuda.synchronize()
    return st.elapsed_time(en)/iters

B, H, L = 4, 16, 4096
for hd, cfgs in CONFIGS.items():
    q = torch.randn(B,H,L,hd,device='cuda',dtype=torch.bfloat16); k=torch.randn_like(q); v=torch.randn_like(q)
    for causal in [False, True]:
        flops = 4*B*H*L*L*hd/(2 if causal else 1)
        t = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q,k,v,is_causal=causal))
        print(f"hd{hd} {'causal' if causal else 'full  '} sdpa            {t:7.3f} ms {flops/t/1e9:6.1f} TF", flush=True)
        for (bq,bk,w) in cfgs:
            name = "causal" if causal else "full"
            d = f"{name}_{hd}_{bq}x{bk}w{w}"
            lib = runtime.load_library(f"{bd}/{d}/libattngen_fwd.so")
            t = bench(lambda: runtime.forward(lib,q,k,v))
            print(f"hd{hd} {'causal' if causal else 'full  '} {bq}x{bk}w{w:<2} r{regs.get(d)} s{regs.get(d+'_spill','0')}  {t:7.3f} ms {flops/t/1e9:6.1f} TF", flush=True)
    # doc mask
    doc = torch.sort(torch.randint(0, 8, (L,))).values.to(torch.int32).cuda()
    slopes = torch.rand(H, device='cuda')
    for (bq,bk,w) in cfgs:
        d = f"alibi_doc_{hd}_{bq}x{bk}w{w}"
        lib = runtime.load_library(f"{bd}/{d}/libattngen_fwd.so")
        def mm(x, blk):
            x = x.view(-1, blk); return x.amin(1).int().contiguous(), x.amax(1).int().contiguous()
        sums = [*mm(doc, bq), *mm(doc, bk)]
        t = bench(lambda: runtime.forward(lib,q,k,v,captured=[slopes, doc], summaries=sums))
        print(f"hd{hd} alibi_doc {bq}x{bk}w{w:<2} r{regs.get(d)} s{regs.get(d+'_spill','0')} {t:7.3f} ms", flush=True)
    bias = torch.randn(L, L, device='cuda', dtype=torch.bfloat16); keep = torch.rand(L, device='cuda') < 0.9
    for (bq,bk,w) in cfgs:
        d = f"bias2d_pad_{hd}_{bq}x{bk}w{w}"
        lib = runtime.load_library(f"{bd}/{d}/libattngen_fwd.so")
        t = bench(lambda: runtime.forward(lib,q,k,v,captured=[bias, keep]))
        print(f"hd{hd} bias2d_pad {bq}x{bk}w{w:<2} r{regs.get(d)} s{regs.get(d+'_spill','0')} {t:7.3f} ms", flush=True)
# host overhead
lib = runtime.load_library(f"{bd}/full_64_64x64w4/libattngen_fwd.so")
q = torch.randn(1,1,16,64,device='cuda',dtype=torch.bfloat16)
for _ in range(100): runtime.forward(lib,q,q,q)
torch.cuda.synchronize()
t=time.perf_counter(); n=2000
for _ in range(n): runtime.forward(lib,q,q,q)
t1=time.perf_counter(); torch.cuda.synchronize()
print(f"host overhead per call {(t1-t)/n*1e6:.1f} us")
out = torch.empty_like(q)
t=time.perf_counter()
for _ in range(n): runtime.forward(lib,q,q,q,out=out)
print(f"  with out= {(time.perf_counter()-t)/n*1e6:.1f} us")
import struct
packed = runtime._PACK.pack(q.data_ptr(), q.data_ptr(), q.data_ptr(), out.data_ptr(), 0, *q.stride()[:3], *q.stride()[:3], *q.stride()[:3], *out.stride()[:3], 1,1,1,16,16,64, 0.125, 0, *([0]*48))
s_ = runtime._raw_stream(0)
t=time.perf_counter()
for _ in range(n): lib.launch(packed, s_)
print(f"  bare ctypes launch {(time.perf_counter()-t)/n*1e6:.1f} us")
t=time.perf_counter()
for _ in range(n): runtime._raw_stream(0)
print(f"  raw stream {(time.perf_counter()-t)/n*1e6:.1f} us")
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(n): runtime.forward(lib,q,q,q)
pr.disable(); torch.cuda.synchronize()
pstats.Stats(pr).sort_stats('tottime').print_stats(12)
t=time.perf_counter()
for _ in range(n): torch.empty((1,1,16,64),dtype=torch.bfloat16,device='cuda')
print(f"  (torch.empty alone {(time.perf_counter()-t)/n*1e6:.1f} us)")
