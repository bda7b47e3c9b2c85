"""FlashAttention-4 (CuTe DSL) packed for the device, where pip cannot reach an index and a call carries at most 64 MiB
with the working tree: `benchmarks/bench_training.py --fa4` times it beside attngen, flex and cuDNN in one process.

    python scripts/fa4_pack.py pack [--out .fa4]        # here: a.tar.xz, b.tar.xz under --out (ignored by git)
    python scripts/fa4_pack.py unpack .fa4/a.tar.xz     # there, one archive per call: into .fa4/site
    eval "$(python scripts/fa4_pack.py env)"            # there: PYTHONPATH for flash_attn.cute

`pack` downloads the anchors' FA4 (flash-attn-4 4.0.0b36, ../shared/anchors/README.md) and what it needs that the
device's image lacks, as CPython 3.12 x86-64 wheels (the DSL's CUDA 13 libraries: the device runs CUDA 13), and unzips
them into one folder. The CuTe DSL's MLIR library alone is about 48 MB compressed, so it is archive a, carried by one
call, and the rest is archive b, carried by the next while the machine is still warm (an ignored folder stays there
between calls).
"""
import argparse
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEELS = ["flash-attn-4==4.0.0b36", "nvidia-cutlass-dsl==4.6.2", "nvidia-cutlass-dsl-libs-base==4.6.2",
          "nvidia-cutlass-dsl-libs-core==4.6.2", "nvidia-cutlass-dsl-libs-cu13==4.6.2", "quack-kernels==0.6.4",
          "apache-tvm-ffi==0.1.15.post2", "torch-c-dlpack-ext==0.1.5"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64"]
BIG = "_cutlass_ir.cu13."  # the file archive a holds
CALL_LIMIT = 64 << 20  # what one call carries, the working tree included
SITE = Path(".fa4/site")


def download(dest: Path, python: str) -> list:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + WHEELS, check=True)
    return sorted(dest.glob("*.whl"))


def pack(out: Path, wheel_dir: Path, python: str) -> None:
    wheels = download(wheel_dir, python)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp)
        for w in wheels:
            zipfile.ZipFile(w).extractall(site)
        files = sorted(p for p in site.rglob("*") if p.is_file())
        big = [p for p in files if BIG in p.name]
        if len(big) != 1:
            raise SystemExit(f"expected one {BIG}*.so among the wheels' files, found {len(big)}")
        out.mkdir(parents=True, exist_ok=True)
        for name, group in (("a", big), ("b", [p for p in files if p not in big])):
            path = out / f"{name}.tar.xz"
            with lzma.open(path, "wb", preset=9) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
                for p in group:
                    tar.add(p, arcname=str(p.relative_to(site)))
            print(f"{path}: {len(group)} files, {path.stat().st_size / 2**20:.1f} MiB")
    tree = sum(os.path.getsize(f) for f in subprocess.run(["git", "ls-files"], capture_output=True, text=True,
                                                           check=True).stdout.split() if os.path.isfile(f))
    for name in ("a", "b"):
        total = tree + (out / f"{name}.tar.xz").stat().st_size
        print(f"a call carrying {name}: {total / 2**20:.1f} MiB with the tree ({'fits' if total < CALL_LIMIT else 'TOO LARGE'})")


def unpack(archive: Path, site: Path) -> None:
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(site, filter="data")
        print(f"{archive} -> {site}: {len(tar.getmembers())} files")


def env(site: Path) -> None:
    site = site.resolve()
    missing = [] if any(site.rglob(f"{BIG}*")) else ["a"]
    missing += [] if (site / "flash_attn" / "cute").is_dir() else ["b"]
    if missing:
        print(f"echo 'FA4 not unpacked: archive(s) {', '.join(missing)} missing under {site}' >&2; false")
        return
    # nvidia_cutlass_dsl's .pth puts dsl_packages on the path; PYTHONPATH does not read .pth files
    print(f"export PYTHONPATH={site}:{site / 'nvidia_cutlass_dsl' / 'dsl_packages'}:${{PYTHONPATH:-}}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("pack")
    a.add_argument("--out", type=Path, default=Path(".fa4"))
    a.add_argument("--wheels", type=Path, default=Path(tempfile.gettempdir()) / "fa4-wheels")
    a.add_argument("--python", default="3.12", help="the CPython the wheels are for (the device's: 3.12; this "
                   "machine's, to try the unpacked folder here under FakeTensorMode)")
    u = sub.add_parser("unpack")
    u.add_argument("archive", type=Path)
    u.add_argument("--site", type=Path, default=SITE)
    e = sub.add_parser("env")
    e.add_argument("--site", type=Path, default=SITE)
    args = p.parse_args(argv)
    if args.cmd == "pack":
        pack(args.out, args.wheels, args.python)
    elif args.cmd == "unpack":
        unpack(args.archive, args.site)
    else:
        env(args.site)


if __name__ == "__main__":
    main()
