"""Integrations: ``flex_attention`` (torch's flex signature), ``AttentionModule`` (an nn.Module) and, with
transformers installed, ``attngen.integrations.hf.register()`` (``attn_implementation="attngen"``).

Submodules load on first use, so importing this package imports neither transformers nor sympy.
"""
__all__ = ["AttentionModule", "flex_attention", "hf"]

_LAZY = {"AttentionModule": "module", "flex_attention": "flex"}


from .._lazy import lazy_attributes

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, submodules=("hf",))
