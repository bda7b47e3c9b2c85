"""Temporary alias of attngen.launch (removed once every caller imports launch)."""
import sys

from . import launch as _launch

sys.modules[__name__] = _launch
