"""Plot a sweep (bench_forward.py --sweep JSON) as sweep.png and a markdown table beside the JSON.
Usage: python benchmarks/plot_sweep.py RESULT.json [--out DIR]   (needs matplotlib; DIR defaults to the JSON's folder)"""
import argparse
import json
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("result")
p.add_argument("--out", default=None)
args = p.parse_args()
args.out = args.out or str(Path(args.result).resolve().parent)
data = json.loads(Path(args.result).read_text())
rows = data.get("sweep") or []
if not rows:
    raise SystemExit(f"{args.result} has no sweep rows: run bench_forward.py --sweep")
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

dims = sorted({r["D"] for r in rows})
masks = sorted({r["variant"] for r in rows})
fig, axes = plt.subplots(len(masks), len(dims), figsize=(4.2 * len(dims), 3.4 * len(masks)), squeeze=False)
for i, m in enumerate(masks):
    for j, d in enumerate(dims):
        ax = axes[i][j]
        sel = sorted((r for r in rows if r["variant"] == m and r["D"] == d), key=lambda r: r["S"])
        xs = [r["S"] for r in sel]
        for key, label in (("attngen_tflops", "attngen"), ("sdpa_tflops", "SDPA (cuDNN)")):
            ys = [r.get(key) for r in sel]
            if any(y is not None for y in ys):
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{m}, D={d}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend()
meta = data.get("meta", {})
fig.suptitle(f"attngen forward sweep - {meta.get('device', '')} - {meta.get('date', '')}")
fig.tight_layout()
fig.savefig(out / "sweep.png", dpi=110)
lines = ["| mask | S | D | attngen TFLOP/s | SDPA TFLOP/s | attngen/SDPA |", "|---|---|---|---|---|---|"]
for r in sorted(rows, key=lambda r: (r["variant"], r["D"], r["S"])):
    a, s = r.get("attngen_tflops"), r.get("sdpa_tflops")
    ratio = f"{a / s:.2f}x" if a and s else "n/a"
    lines.append(f"| {r['variant']} | {r['S']} | {r['D']} | {f'{a:.1f}' if a else 'n/a'} | {f'{s:.1f}' if s else 'n/a'} "
                 f"| {ratio} |")
(out / "sweep.md").write_text(f"# Forward sweep ({meta.get('device', '')}, {meta.get('date', '')})\n\n" + "\n".join(lines) + "\n")
print(f"wrote {out / 'sweep.png'} and {out / 'sweep.md'}")
