"""A variant's analysis cached on disk by its fingerprint, so a new process compiles a variant it has seen
before without tracing, deriving or importing sympy.

``variant_facts(variant)`` returns the ``VariantFacts`` of a variant: the sympy-free part of its analysis
that a call and a kernel's cache key need (canonical text, whether it masks / modifies scores, the captured
tensors bound to the live objects, the runtime summaries). With a fingerprint (fingerprint.py) it first
looks for the record ``<cache root>/analysis/<fingerprint>.json``; on a miss it runs the analysis (trace +
derive, analysis.py) and writes the record when that is sound: the trace read no tensor values, and every
tensor it captured is one the fingerprint walk met (the record names it by walk position). A cache root
that cannot be written only costs the record. Records are read (never written) from every root the kernel
lookup reads too: read-only roots and prebuilt roots ship the records of their variants, so a deployment's first
call of a library variant needs no sympy when its Python, torch and sympy match the build's (docs/deploy.md).
"""
from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import torch

from .cache import CacheError, default_cache, write_if_different
from .fingerprint import Fingerprint, fingerprint
from .ir import CapturedTensor, ParamSlot, Summary

# Bumped when the record layout changes; a record of another format is a miss (and is rewritten).
RECORD_FORMAT = 4
RECORD_DIR = "analysis"

_RECORDS = {}  # fingerprint digest -> parsed record, so a process reads each record file once
_RECORDS_SIZE = 256
_LOCK = threading.Lock()


@dataclass(frozen=True)
class VariantFacts:
    """What calls and kernel cache keys need from a variant's analysis, without sympy."""

    canonical: str  # TracedVariant.canonical()
    has_mask: bool
    has_score_mod: bool
    captured: Tuple[CapturedTensor, ...]  # bound to the live tensors
    summaries: Tuple[Summary, ...]
    params: Tuple[ParamSlot, ...] = ()  # runtime parameters, bound to the live RuntimeParams
    reads_b: bool = False  # a mod reads the batch index (a batch of one would show it b = 0)
    half_plane: bool = False  # the mask is one linear inequality in q_idx, kv_idx and parameters (causal-like)

    @classmethod
    def of(cls, traced, predicates) -> "VariantFacts":
        from .predicates import is_half_plane
        from .symbols import B

        return cls(traced.canonical(), traced.has_mask, traced.has_score_mod, tuple(traced.captured),
                   tuple(predicates.summaries), tuple(traced.params),
                   B in (traced.score.free_symbols | traced.mask.free_symbols),
                   is_half_plane(traced.mask, {p.symbol for p in traced.params}))



def variant_facts(variant) -> Tuple[VariantFacts, Optional[tuple]]:
    """(facts, (traced, predicates)) of a Variant; the pair is None when the facts came from a record (the
    analysis was not run). Errors of the mods (UnsupportedOperation) surface here on a miss, as from trace."""
    fp = fingerprint(variant)
    if fp is not None:
        facts = _read_record(fp)
        if facts is not None:
            return facts, None
    from .analysis import analyze_watched  # the sympy stages: only on a miss

    traced, predicates, value_read = analyze_watched(variant)
    facts = VariantFacts.of(traced, predicates)
    if fp is not None and value_read is None:
        _write_record(fp, facts)
    return facts, (traced, predicates)


def record_path(digest: str) -> Path:
    """Where a record is written: the writable cache root (created if needed)."""
    return default_cache().root / RECORD_DIR / f"{digest}.json"


def _stored_records(digest: str):
    """The parsed record files of ``digest`` in the roots the kernel lookup reads, in its order (read-only and
    prebuilt roots, then the user cache), checked as entries are (owner, mode, no symlink; a prebuilt root's
    listed with their sha256): a planted record could drop a variant's mask. Reads only, creates no directory."""
    try:
        for data in default_cache().read_root_files(f"{RECORD_DIR}/{digest}.json"):
            try:
                yield json.loads(data.decode("utf-8"))
            except ValueError:
                continue
    except (OSError, CacheError):
        return


# ----------------------------------------------------------------------------------------------------------
# encoding: every field of CapturedTensor (but the live tensor) and of Summary, as JSON


def _encode_value(x):
    if isinstance(x, torch.dtype):
        return {"torch.dtype": str(x).replace("torch.", "")}
    if isinstance(x, (tuple, list)):
        return [_encode_value(y) for y in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"no JSON form for {type(x).__name__}")


def _decode_value(x):
    if isinstance(x, dict):
        dtype = getattr(torch, x["torch.dtype"])
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{x!r} is not a torch dtype")
        return dtype
    if isinstance(x, list):
        return tuple(_decode_value(y) for y in x)
    return x


def _encode(facts: VariantFacts, fp: Fingerprint) -> Optional[dict]:
    """The record of ``facts``, or None when a captured tensor is not one the fingerprint walk met."""
    captured = []
    for c in facts.captured:
        pos = next((i for i, t in enumerate(fp.tensors) if t is c.tensor), None)
        if pos is None:
            return None
        fields = {f.name: _encode_value(getattr(c, f.name)) for f in dataclasses.fields(c) if f.name != "tensor"}
        captured.append({"position": pos, "fields": fields})
    summaries = [{f.name: _encode_value(getattr(s, f.name)) for f in dataclasses.fields(s)} for s in facts.summaries]
    params = []
    for p in facts.params:
        pos = next((i for i, x in enumerate(fp.params) if x is p.param), None)
        if pos is None:  # a parameter the walk did not meet (reached through something it cannot see)
            return None
        params.append({"position": pos, "fields": {f.name: getattr(p, f.name) for f in dataclasses.fields(p)
                                                   if f.name != "param"}})
    return {"format": RECORD_FORMAT, "fingerprint": fp.digest, "canonical": facts.canonical,
            "has_mask": facts.has_mask, "has_score_mod": facts.has_score_mod, "reads_b": facts.reads_b,
            "half_plane": facts.half_plane,
            "captured": captured, "summaries": summaries, "params": params}


def _decode(record: dict, fp: Fingerprint) -> VariantFacts:
    """VariantFacts of a record, its captured tensors bound to the walk's tensors; raises on anything odd."""
    if record["format"] != RECORD_FORMAT or record["fingerprint"] != fp.digest:
        raise ValueError("record of another format or fingerprint")
    captured = []
    for entry in record["captured"]:
        t = fp.tensors[entry["position"]]
        c = CapturedTensor(tensor=t, **{k: _decode_value(v) for k, v in entry["fields"].items()})
        if c.dtype != t.dtype or c.rank != t.dim():
            raise ValueError("record does not describe the live tensor")
        captured.append(c)
    summaries = tuple(Summary(**{k: _decode_value(v) for k, v in s.items()}) for s in record["summaries"])
    params = []
    for entry in record["params"]:
        live = fp.params[entry["position"]]
        p = ParamSlot(param=live, **entry["fields"])
        if (p.label, p.integer, p.minimum) != (live.name, live.integer, live.minimum) or p.slot != len(params):
            raise ValueError("record does not describe the live parameter")
        params.append(p)
    canonical, has_mask, has_score_mod = record["canonical"], record["has_mask"], record["has_score_mod"]
    reads_b, half_plane = record["reads_b"], record["half_plane"]
    if not (isinstance(canonical, str) and all(isinstance(x, bool)
                                               for x in (has_mask, has_score_mod, reads_b, half_plane))):
        raise ValueError("record fields of the wrong type")
    return VariantFacts(canonical, has_mask, has_score_mod, tuple(captured), summaries, tuple(params), reads_b,
                        half_plane)


def _all_fields(obj) -> tuple:
    """Every field of a dataclass, compare=False ones included (the live tensor by identity)."""
    return tuple(id(v) if isinstance(v, torch.Tensor) else v
                 for v in (getattr(obj, f.name) for f in dataclasses.fields(obj)))


def _read_record(fp: Fingerprint) -> Optional[VariantFacts]:
    with _LOCK:
        record = _RECORDS.get(fp.digest)
    for record in [record] if record is not None else _stored_records(fp.digest):
        try:
            facts = _decode(record, fp)
            break
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            continue  # damaged or foreign: a miss (unless another root has it), and the analysis rewrites it
    else:
        return None
    with _LOCK:
        if len(_RECORDS) >= _RECORDS_SIZE:
            _RECORDS.clear()
        _RECORDS[fp.digest] = record
    return facts


def _write_record(fp: Fingerprint, facts: VariantFacts) -> None:
    try:
        record = _encode(facts, fp)
    except TypeError:  # a field this format has no JSON form for: analysed every time, never misread
        return
    if record is None:
        return
    text = json.dumps(record, sort_keys=True, indent=1)
    try:
        decoded = _decode(json.loads(text), fp)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return
    same = (decoded.canonical, decoded.has_mask, decoded.has_score_mod, decoded.reads_b) == (
        facts.canonical, facts.has_mask, facts.has_score_mod, facts.reads_b)
    same = same and [_all_fields(c) for c in decoded.captured] == [_all_fields(c) for c in facts.captured]
    same = same and [_all_fields(s) for s in decoded.summaries] == [_all_fields(s) for s in facts.summaries]
    same = same and [(p, id(p.param)) for p in decoded.params] == [(p, id(p.param)) for p in facts.params]
    if not same:
        return
    try:
        write_if_different(record_path(fp.digest), text)
    except (OSError, CacheError):
        return  # a read-only cache only costs the analysis next time
    with _LOCK:
        _RECORDS[fp.digest] = record
