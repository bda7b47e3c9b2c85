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
from attngen.errors import CacheError


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def build_parser(prog: str = "python -m attngen cache") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Inspect or clear attngen's compiled-kernel cache.")
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("ls", help="list cached kernels")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("clear", help="remove every cached kernel")
    inf = sub.add_parser("info", help="show meta.json of one entry")
    inf.add_argument("key", help="key, key prefix or directory name (see `ls`)")
    sub.add_parser("path", help="print the cache root")
    return p


def main(argv: Sequence[str] | None = None, cache: ArtifactCache | None = None) -> int:
    args = build_parser().parse_args(argv)
    c = cache or default_cache()
    out = sys.stdout
    try:
        if args.cmd == "path":
            print(c.root, file=out)
        elif args.cmd == "ls":
            entries = c.list_entries()
            if args.json:
                rows = [{"name": e.name, "key": e.key, "size": e.size, "created": e.created, "path": str(e.path)}
                        for e in entries]
                json.dump(rows, out, indent=2)
                out.write("\n")
            else:
                width = max([len(e.name) for e in entries] + [4])
                print(f"{'NAME':<{width}}  {'KEY':<16}  {'SIZE':>10}  CREATED", file=out)
                for e in entries:
                    print(f"{e.name:<{width}}  {e.key[:16]:<16}  {_size(e.size):>10}  {_when(e.created)}", file=out)
                total = sum(e.size for e in entries)
                print(f"{len(entries)} {'entry' if len(entries) == 1 else 'entries'}, {_size(total)} in {c.root}", file=out)
        elif args.cmd == "clear":
            n = c.clear()
            print(f"removed {n} {'entry' if n == 1 else 'entries'} from {c.root}", file=out)
        elif args.cmd == "info":
            json.dump(c.info(args.key), out, indent=2, default=str)
            out.write("\n")
    except CacheError as e:
        print(f"attngen: error: {e}", file=sys.stderr)
        return 1
    return 0
