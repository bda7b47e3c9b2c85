"""The `cache` subcommand: `python -m attngen cache ls | clear | info KEY | path`.

The top-level CLI delegates with `return attngen.cache.cli.main(argv_after_the_word_cache)`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Sequence

from attngen.cache.store import ArtifactCache, default_cache
from attngen.errors import AttngenError, CacheError


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def build_parser(prog: str = "python -m attngen cache") -> argparse.ArgumentParser:
    verbose_help = "show the full traceback of an error"
    # accepted before or after the subcommand; SUPPRESS keeps a subcommand's default from undoing `-v ls`
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    p = argparse.ArgumentParser(prog=prog, description="Inspect or clear attngen's compiled-kernel cache.")
    p.add_argument("--verbose", "-v", action="store_true", help=verbose_help)
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("ls", help="list cached kernels (the user cache and the read-only roots)", parents=[common])
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("clear", help="remove every kernel of the user cache (read-only roots are never touched)",
                   parents=[common])
    inf = sub.add_parser("info", help="show meta.json of one entry", parents=[common])
    inf.add_argument("key", help="key, key prefix or directory name (see `ls`)")
    sub.add_parser("path", help="print the root new builds go to", parents=[common])
    return p


def error_line(e: BaseException) -> str:
    """One line for an error at the command line: its first line, plus the first compiler error of a build's
    attached output and how to see the rest."""
    text = str(e).strip() or type(e).__name__
    if isinstance(e, OSError) and not isinstance(e, AttngenError):
        text = f"{e.strerror or e}: {e.filename}" if e.filename else str(e)
    first, _, rest = text.partition("\n")
    first = first.removeprefix("attngen: ").removeprefix("error: ")
    line = f"attngen: error: {first}"
    more = [ln.strip() for ln in rest.splitlines() if ln.strip()]
    if more:
        err = next((ln for ln in more if "error" in ln.lower()), None)
        if err:
            line += f" First error: {err[:300]}"
        line += f" ({len(more)} more lines: rerun with --verbose)"
    return line


def main(argv: Sequence[str] | None = None, cache: ArtifactCache | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args, cache or default_cache(), sys.stdout)
    except (AttngenError, OSError) as e:
        if args.verbose:
            raise
        print(error_line(e), file=sys.stderr)
        return 1


def _planned(c: ArtifactCache) -> str:
    """The root builds would go to, without creating it (`path` and `ls` only read)."""
    root = c.planned_root()
    if root is None:
        raise CacheError("attngen cache: no writable cache directory. Fix: set ATTNGEN_CACHE_DIR to a writable "
                         "directory you own.")
    return str(root)


def _run(args, c: ArtifactCache, out) -> int:
    if args.cmd == "path":
        print(_planned(c), file=out)
    elif args.cmd == "ls":
        entries = c.list_entries()
        if args.json:
            rows = [{"name": e.name, "key": e.key, "size": e.size, "created": e.created, "path": str(e.path),
                     "source": e.source} for e in entries]
            json.dump(rows, out, indent=2)
            out.write("\n")
            return 0
        width = max([len(e.name) for e in entries] + [4])
        print(f"{'NAME':<{width}}  {'KEY':<16}  {'SIZE':>10}  {'CREATED':<16}  SOURCE", file=out)
        for e in entries:
            print(f"{e.name:<{width}}  {e.key[:16]:<16}  {_size(e.size):>10}  {_when(e.created):<16}  {e.source}",
                  file=out)
        total = sum(e.size for e in entries)
        print(f"{len(entries)} {'entry' if len(entries) == 1 else 'entries'}, {_size(total)}; new builds go to "
              f"{c.planned_root() or 'nowhere (no writable directory)'}", file=out)
        for d in c.readonly_roots():
            print(f"looked up read-only: {d}", file=out)
    elif args.cmd == "clear":
        n = c.clear()
        print(f"removed {n} {'entry' if n == 1 else 'entries'} from {c.root}", file=out)
    elif args.cmd == "info":
        json.dump(c.info(args.key), out, indent=2, default=str)
        out.write("\n")
    return 0
