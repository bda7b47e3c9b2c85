"""`python -m attngen.cache ls | clear | info KEY | path` (same as `python -m attngen cache ...`)."""

from attngen.cache.cli import main

raise SystemExit(main())
