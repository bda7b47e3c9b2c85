"""Temporary shim (removed once every caller imports attngen.jit.*)."""
from .abi import SM90_FALLBACK_CODES, SUPPORTED_HEAD_DIMS  # noqa: F401
from .jit.ninja import BASE_FLAGS, LIBRARY_NAME, LINK_FLAGS, run_ninja, write_build_ninja  # noqa: F401
from .jit.render import KERNEL_SOURCE, TEMPLATE_DIR, VARIANT_INCLUDE, render_sources, template_hash  # noqa: F401
from .jit.render import _jinja_env, dtype_info as _dtype_info  # noqa: F401
from .jit.tiles import SM90_LADDER, SM90_TILES, SM90_WIDE, Sm90Tiles, TileConfig, sm90_ladder, tile_config  # noqa: F401
from .jit.toolchain import arch_flags, current_arch, find_nvcc, nvcc_available, nvcc_version  # noqa: F401
from .jit.toolchain import parse_arch as _parse_arch, arch_number as _arch_number  # noqa: F401
