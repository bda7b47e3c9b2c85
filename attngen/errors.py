"""Exceptions raised by attngen. Every message names the problem and the fix."""


class AttngenError(Exception):
    """Base class of every attngen error."""


class UnsupportedOperation(AttngenError, TypeError):
    """A score_mod/mask_mod used something the tracer cannot turn into an expression."""


class InputError(AttngenError, ValueError):
    """Tensors passed to an attention call do not match what the kernel accepts."""


class ModSignatureError(InputError, TypeError):
    """A mod whose signature does not fit where it was passed (a score_mod given as mask_mod, or the
    reverse). Also a TypeError: calling it with the wrong argument count used to raise one."""


class BuildError(AttngenError, RuntimeError):
    """Generating, compiling or loading a kernel failed (compiler output attached)."""


class CacheError(AttngenError, RuntimeError):
    """The on-disk artifact cache could not be used."""


class KernelLaunchError(AttngenError, RuntimeError):
    """The CUDA runtime refused to launch a compiled kernel (``code``: the library's return code)."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code
