"""The JIT layer: toolchain -> tile policy -> rendering -> ninja -> kernel spec (build, cache, spill ladder).

Imports point down this list: ``spec`` uses the others, none of them uses ``spec``.
"""
