"""Tile settings as the device scripts take them on their command lines: `FIELD=VALUE,...`, integer values, fields of
jit.tiles.Sm90BwdTiles (or Sm90Tiles), the forward's prefixed `fwd.` where a script sets both (bwd_tiles_ab.py)."""


def setting_fields(setting: str, fwd: bool = False) -> dict:
    """{field: int value} of `setting`: its unprefixed fields, or with `fwd` its `fwd.` ones without the prefix."""
    pairs = (f.split("=") for f in setting.split(",") if f)
    return {name[4:] if fwd else name: int(value) for name, value in pairs if name.startswith("fwd.") == fwd}


def bwd_rung_ladder(setting: str):
    """A stand-in for jit.tiles.sm90_bwd_ladder with one rung: the head dim's SM90_BWD_TILES entry with `setting`'s
    fields replaced (what a script assigns to jit.spec.sm90_bwd_ladder to build and time that rung alone)."""
    from dataclasses import replace

    from attngen.jit.tiles import SM90_BWD_TILES

    fields = setting_fields(setting)
    return lambda hd, **_: (replace(SM90_BWD_TILES[hd], **fields),)
