"""Compiled variants shared by the integrations, looked up in a way torch.compile can trace.

``attngen.compile`` traces mods and reads the disk cache: dynamo cannot trace it. So a lookup goes through a
function dynamo *calls* at trace time instead of tracing (``torch.compiler.assume_constant_result``): it compiles
on a miss and returns a string key; the traced code then reads the object from the module-level dict, which holds
it by the time dynamo looks (dynamo guards on the dict entry like on any global). A call outside torch.compile
takes the same path at the cost of one dict lookup.

Entries are never evicted: a compiled graph names a variant by its op id, which must stay resolvable while the
graph lives (frontend.CompiledAttention), and the user functions in a key are held so their ids are never reused.
"""
from __future__ import annotations

import threading

import torch

_LOCK = threading.Lock()


def constant_result(fn):
    """``torch.compiler.assume_constant_result`` without importing torch._dynamo (and with it sympy) when attngen's
    integrations are imported: that decorator's whole effect is this attribute (torch 2.4 to 2.13).
    tests/test_integrations.py checks under torch.compile that the lookups stay constant."""
    fn._dynamo_marked_constant = True
    return fn


# key -> (the objects the key was made from, held so their ids stay unique; the CompiledAttention)
COMPILED: dict = {}


def _key_of(parts) -> str:
    return "|".join(f"{type(p).__name__}:{id(p)}" if callable(p) else repr(p) for p in parts)


@constant_result
def compiled_key(score_mod, mask_mod, causal, window, softcap) -> str:
    """The key of ``attngen.compile(score_mod, mask_mod, causal=..., window=..., softcap=...)`` in ``COMPILED``,
    compiled on first use. Functions count by identity, the other arguments by value."""
    key = _key_of((score_mod, mask_mod, causal, window, softcap))
    if key not in COMPILED:
        with _LOCK:
            if key not in COMPILED:
                from ..frontend import compile

                attn = compile(score_mod, mask_mod, causal=causal, window=window, softcap=softcap)
                COMPILED[key] = ((score_mod, mask_mod), attn)
    return key


def compiled(score_mod=None, mask_mod=None, causal=False, window=None, softcap=None):
    """The cached ``attngen.compile(...)`` of these arguments (traceable by torch.compile, see the module doc)."""
    return COMPILED[compiled_key(score_mod, mask_mod, causal, window, softcap)][1]
