"""Context parallelism: attention over a sequence sharded along its length across the ranks of a process group
(``torch.distributed``: NCCL on GPUs, gloo on CPUs), for any variant.

Layout. The S positions are cut into chunks: ``zigzag`` (2R chunks over R ranks; rank r holds chunks r and
2R - 1 - r, so under causal-like masks every rank has the same work) or ``contiguous`` (R chunks; rank r holds
chunk r). ``shard_sequence`` / ``unshard_sequence`` move between a full tensor and a rank's shard. DTensors
sharded on the sequence dim (``Shard(2)``, contiguous chunks) over a 1-D device mesh are taken as they are.

Forward. Round s = 0 .. R - 1 pairs this rank's query chunks with the key/value chunks of rank r - s. A pair is
one call of attngen's attention op on the chunks, with the queries' global start as ``q_offset`` and the keys' as
a runtime parameter of a copy of the variant whose mods read ``kv_idx + kv_start`` (one build serves every
pair); the pairs' outputs are merged by their LSE in fp32. The variant's block map at block = chunk (its derived
predicates) proves pairs empty: they are not computed, and a rank none of whose chunks another rank's queries see
does not send it its K/V at all. ``exchange="p2p"``: round s sends to r + s and receives from r - s (one
``batch_isend_irecv``, the next round's issued before this round's compute); ``"allgather"`` gathers every rank's
K/V once.

Backward. The same rounds: each pair's gradients from attngen's backward op given the merged output and LSE (so
P is the softmax over the whole sequence), dq kept, dk / dv sent back to the rank that holds those keys and summed
there. Gradients of captured tensors are this rank's share: reduce them over the group as for any replicated
parameter (DDP / FSDP over the context-parallel ranks).
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .errors import InputError
from .sequences import shifted_variant
from .params import param
from .reference import _check_scale, compute_dtype

__all__ = ["LAYOUTS", "EXCHANGES", "CPStats", "context_parallel_attention", "last_stats", "shard_sequence",
           "unshard_sequence"]

LAYOUTS = ("zigzag", "contiguous")
EXCHANGES = ("p2p", "allgather")


# ------------------------------------------------------------------------------------------------ layout

def _n_chunks(world: int, layout: str) -> int:
    return 2 * world if layout == "zigzag" else world


def _held(rank: int, world: int, layout: str) -> Tuple[int, ...]:
    """The chunk indices rank ``rank`` holds, in the order its shard concatenates them."""
    return (rank, 2 * world - 1 - rank) if layout == "zigzag" else (rank,)


def _group_info(group) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise InputError("context parallelism needs an initialised process group: call "
                         "torch.distributed.init_process_group('nccl' or 'gloo') first, or pass group=")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank < 0:
        raise InputError("this process is not a member of the group passed as group=: call with a group it belongs to")
    return world, rank


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise InputError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def shard_sequence(x: torch.Tensor, group=None, layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """This rank's shard of ``x`` (the whole sequence along ``dim``, the same on every rank): its chunks, in
    ``layout``'s order, concatenated. The length must be a multiple of the number of chunks."""
    _check_layout(layout)
    world, rank = _group_info(group)
    n = _n_chunks(world, layout)
    if x.shape[dim] % n:
        raise InputError(f"a sequence of {x.shape[dim]} positions cannot be cut into the {n} equal chunks of "
                         f"layout {layout!r} over {world} ranks; pad it to a multiple of {n}")
    chunks = x.chunk(n, dim)
    return torch.cat([chunks[c] for c in _held(rank, world, layout)], dim)


def unshard_sequence(x: torch.Tensor, group=None, layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """The whole sequence from every rank's shard (an all-gather), in position order, on every rank. Not
    differentiable (torch.distributed's all_gather records no graph)."""
    _check_layout(layout)
    world, _ = _group_info(group)
    shards = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(shards, x.contiguous(), group=group)
    per = len(_held(0, world, layout))
    out = [None] * _n_chunks(world, layout)
    for r, shard in enumerate(shards):
        for c, piece in zip(_held(r, world, layout), shard.chunk(per, dim)):
            out[c] = piece
    return torch.cat(out, dim)


# ------------------------------------------------------------------------------------------------ the plan

@dataclasses.dataclass
class CPStats:
    """What the last context-parallel call did on this rank (``last_stats()``): the chunk pairs its forward
    computed and proved empty, and the K/V messages its forward (and its backward, once that ran) sent and did not
    send because the receiver needs none of them. A new forward starts the counts again."""

    pairs_computed: int = 0
    pairs_skipped: int = 0
    kv_sends: int = 0
    kv_sends_skipped: int = 0


_STATS = CPStats()


def last_stats() -> CPStats:
    return dataclasses.replace(_STATS)


@dataclasses.dataclass(frozen=True)
class _Plan:
    world: int
    rank: int
    layout: str
    chunk: int
    live: torch.Tensor  # bool (n_chunks, n_chunks): query chunk i sees key chunk j somewhere (any b, h)

    def pairs(self, src: int) -> List[Tuple[int, int, int, int]]:
        """(query piece, key piece, query chunk, key chunk) of this rank's queries and rank src's keys, live ones."""
        mine, theirs = _held(self.rank, self.world, self.layout), _held(src, self.world, self.layout)
        return [(a, b, i, j) for a, i in enumerate(mine) for b, j in enumerate(theirs) if self.live[i, j]]

    def needs(self, dst: int, src: int) -> bool:
        """Whether rank dst's queries see any of rank src's keys."""
        mine, theirs = _held(dst, self.world, self.layout), _held(src, self.world, self.layout)
        return any(bool(self.live[i, j]) for i in mine for j in theirs)


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _plan(attn, world: int, rank: int, layout: str, chunk: int, batch: int, heads: int) -> _Plan:
    """The chunk-level block map of ``attn`` over the whole sequence (every b and h where the predicates read
    them), from the variant's derived predicates: the same on every rank, so every rank knows who needs what.
    Memoised by what it reads: the sizes, the runtime parameters' values and the captured tensors' storage and
    version (an in-place update of a document-id tensor changes the map)."""
    key = (world, rank, layout, chunk, batch, heads, tuple(p.param.value for p in attn.facts.params),
           tuple((c.tensor.data_ptr(), c.tensor._version, tuple(c.tensor.shape)) for c in attn.facts.captured))
    memo = _PLANS.setdefault(attn, {})
    if len(memo) > 64:  # a parameter swept over many values: keep the memo small
        memo.clear()
    if key not in memo:
        from .blockmap import block_map

        n = _n_chunks(world, layout)
        S = n * chunk
        from .symbols import B as B_SYM, H as H_SYM

        preds = attn.predicates
        bs = range(batch) if preds.walk_reads(B_SYM) else (0,)
        hs = range(heads) if preds.walk_reads(H_SYM) else (0,)
        live = torch.zeros(n, n, dtype=torch.bool)
        for b in bs:
            for h in hs:
                live |= block_map(attn, S, S, block=(chunk, chunk), b=b, h=h) > 0
        memo[key] = _Plan(world, rank, layout, chunk, live)
    return memo[key]


# ------------------------------------------------------------------------------------------------ the pairs

_SHIFTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _shifted(attn):
    """(a compiled copy of ``attn`` whose mods read kv_idx + kv_start, the kv_start parameter): one build for every
    chunk pair, the keys' global start a kernel argument."""
    if attn not in _SHIFTED:
        from .frontend import CompiledAttention

        start = param("cp_kv_start", 0, minimum=0)
        variant = shifted_variant(attn.variant, kv0=start)
        _SHIFTED[attn] = (CompiledAttention(variant, backend=attn.backend, fast_math=attn.fast_math,
                                            deterministic=attn.deterministic), start)
    return _SHIFTED[attn]


def _params(shifted, start, kv_start: int, base: Dict[int, float]) -> List[float]:
    """The op's parameter values: the keys' start, and the variant's own parameters as the call began."""
    return [float(kv_start) if p.param is start else base[id(p.param)] for p in shifted.facts.params]


def _merge(out_acc, lse_acc, out, lse) -> None:
    """out_acc, lse_acc (fp32, or fp64) <- the softmax over both key sets, in place; rows that see nothing stay 0, -inf."""
    new = torch.logaddexp(lse_acc, lse)
    seen = torch.isfinite(new)
    w_old = torch.where(seen, torch.exp(lse_acc - new), 0.0)
    w_new = torch.where(seen, torch.exp(lse - new), 0.0)
    out_acc.mul_(w_old.unsqueeze(-1)).add_(out.to(out_acc.dtype) * w_new.unsqueeze(-1))
    lse_acc.copy_(new)


def _peer(group, rank: int) -> int:
    """A group rank as the global rank P2POp takes."""
    return rank if group is None else dist.get_global_rank(group, rank)


class _Ring:
    """The K/V (or dK/dV) messages of the rounds: round s sends this rank's buffer to rank + s if that rank needs
    it and receives rank - s's if this rank needs it (plan.needs), or every rank's at once (allgather)."""

    def __init__(self, plan: _Plan, exchange: str, group, local: torch.Tensor):
        self.plan, self.exchange, self.group, self.local = plan, exchange, group, local
        self.gathered = None
        self.pending: Dict[int, Tuple[list, Optional[torch.Tensor]]] = {}

    def start(self, s: int) -> None:
        """Issue round s's messages (p2p), or gather everything (allgather, once)."""
        plan = self.plan
        if s == 0 or s >= plan.world or s in self.pending:
            return
        if self.exchange == "allgather":
            if self.gathered is None:
                self.gathered = [torch.empty_like(self.local) for _ in range(plan.world)]
                dist.all_gather(self.gathered, self.local, group=self.group)
                _STATS.kv_sends += plan.world - 1
            return
        dst, src = (plan.rank + s) % plan.world, (plan.rank - s) % plan.world
        ops, buf = [], None
        if plan.needs(dst, plan.rank):
            ops.append(dist.P2POp(dist.isend, self.local, _peer(self.group, dst), self.group))
            _STATS.kv_sends += 1
        else:
            _STATS.kv_sends_skipped += 1
        if plan.needs(plan.rank, src):
            buf = torch.empty_like(self.local)
            ops.append(dist.P2POp(dist.irecv, buf, _peer(self.group, src), self.group))
        self.pending[s] = (dist.batch_isend_irecv(ops) if ops else [], buf)

    def get(self, s: int) -> Optional[torch.Tensor]:
        """Round s's received buffer (None when this rank needs nothing from rank - s), waiting for it."""
        plan = self.plan
        if s == 0:
            return self.local
        if self.exchange == "allgather":
            src = (plan.rank - s) % plan.world
            return self.gathered[src] if plan.needs(plan.rank, src) else None
        reqs, buf = self.pending.pop(s)
        for r in reqs:
            r.wait()
        return buf

    def finish(self) -> None:
        for reqs, _ in self.pending.values():
            for r in reqs:
                r.wait()
        self.pending.clear()


class _Homeward:
    """The backward's dK/dV: round s's part for rank r - s's keys goes back to it right after it is computed,
    while this rank receives, from rank r + s, the part for its own keys (one round in flight); sum() waits for
    the last and returns every part this rank's keys got, its own included."""

    def __init__(self, plan: _Plan, group, shape, dtype, device):
        self.plan, self.group = plan, group
        self.total = torch.zeros(shape, dtype=dtype, device=device)
        self.inflight = None  # (requests, receive buffer or None, the sent part kept alive)

    def _drain(self) -> None:
        if self.inflight is not None:
            reqs, buf, _ = self.inflight
            for r in reqs:
                r.wait()
            if buf is not None:
                self.total += buf
            self.inflight = None

    def round(self, s: int, part: Optional[torch.Tensor]) -> None:
        plan = self.plan
        if s == 0:
            if part is not None:
                self.total += part
            return
        self._drain()
        dst, src = (plan.rank - s) % plan.world, (plan.rank + s) % plan.world
        ops, buf = [], None
        if plan.needs(plan.rank, dst):  # this rank's queries saw rank r - s's keys: it computed a part
            ops.append(dist.P2POp(dist.isend, part, _peer(self.group, dst), self.group))
        if plan.needs(src, plan.rank):  # rank r + s's queries saw this rank's keys
            buf = torch.empty_like(self.total)
            ops.append(dist.P2POp(dist.irecv, buf, _peer(self.group, src), self.group))
        self.inflight = (dist.batch_isend_irecv(ops) if ops else [], buf, part)

    def sum(self) -> torch.Tensor:
        self._drain()
        return self.total


# ------------------------------------------------------------------------------------------------ entry point

def context_parallel_attention(attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None,
                               layout: str = "zigzag", exchange: str = "p2p", scale: Optional[float] = None,
                               return_lse: bool = False):
    """Attention of ``attn`` (what ``attngen.compile`` returns) over a sequence sharded along dim 2 across
    ``group``: q (B, Hq, L, D), k / v (B, Hkv, L, D) are this rank's shards (``shard_sequence`` with the same
    ``layout``), L the same on every rank. Or q, k, v are DTensors sharded on dim 2 (``Shard(2)``) over a 1-D
    device mesh: the mesh's group and layout ``contiguous`` (how Shard cuts) are used, and the output is a DTensor
    placed alike (``group`` and ``layout`` must then be left out). Captured tensors are indexed by global positions: they must cover
    the whole sequence and be the same on every rank. Returns this rank's shard of the output (and of the LSE
    (B, Hq, L), float32, float64 for float64 inputs). Differentiable in q, k, v, the LSE and the variant's
    captured tensors (see the module docstring)."""
    from .frontend import CompiledAttention
    from .ir import check_extents

    mesh = _dtensor_mesh(q, k, v, group, layout)
    if mesh is not None:
        from torch.distributed.tensor import DTensor, Shard

        out = context_parallel_attention(attn, q.to_local(), k.to_local(), v.to_local(), group=mesh.get_group(),
                                         layout="contiguous", exchange=exchange, scale=scale, return_lse=return_lse)
        wrap = lambda t: DTensor.from_local(t, mesh, [Shard(2)], run_check=False)  # noqa: E731
        return tuple(wrap(t) for t in out) if return_lse else wrap(out)
    if not isinstance(attn, CompiledAttention):
        raise InputError(f"attn must be what attngen.compile returns, got {type(attn).__name__}")
    _check_layout(layout)
    if exchange not in EXCHANGES:
        raise InputError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    world, rank = _group_info(group)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise InputError(f"{name} must be a 4-D tensor (batch, heads, local seq_len, head_dim), got "
                             f"{getattr(t, 'shape', type(t).__name__)}")
        if t.dtype == torch.float8_e4m3fn:
            raise InputError("context parallelism does not take FP8 (float8_e4m3fn) inputs (its chunks would lose the "
                             "descale factors): pass bfloat16 or float16")
    if k.shape != v.shape:
        raise InputError(f"k and v must have one shape here (K and V travel together), got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if k.shape[2] != q.shape[2]:
        raise InputError(f"q and k must hold the same positions (local lengths {q.shape[2]} and {k.shape[2]}): "
                         "context parallelism shards one sequence of queries and keys")
    per = len(_held(rank, world, layout))
    if q.shape[2] % per:
        raise InputError(f"layout {layout!r} gives each rank {per} chunks, so the local length ({q.shape[2]}) must "
                         "be a multiple of it: shard with attngen.distributed.shard_sequence")
    B, Hq, L, D = q.shape
    scale = _check_scale(scale, D)
    chunk = L // per
    S = chunk * _n_chunks(world, layout)
    captured = [c.tensor for c in attn.facts.captured]
    if captured:  # at the whole sequence's positions, before any rank talks: a short tensor fails everywhere alike
        check_extents(attn.facts.captured, captured, B, Hq, S, S, 0)
    plan = _plan(attn, world, rank, layout, chunk, B, Hq)
    _agree(group, q, world, (L, B, Hq, k.shape[1], D, str(q.dtype), layout, exchange, repr(scale),
                             tuple(p.param.value for p in attn.facts.params), plan.live.flatten().tolist()))
    shifted, start = _shifted(attn)
    base = {id(p.param): float(p.param.value) for p in shifted.facts.params}
    out, lse = _CPAttention.apply(q, k, v, shifted, start, base, plan, exchange, group, scale, *captured)
    return (out, lse) if return_lse else out


def _dtensor_mesh(q, k, v, group, layout):
    """The 1-D device mesh of DTensor inputs sharded on the sequence dim, or None for plain tensors."""
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:  # a torch without DTensor: plain tensors only
        return None
    kinds = [isinstance(t, DTensor) for t in (q, k, v)]
    if not any(kinds):
        return None
    if not all(kinds):
        raise InputError("q, k and v must all be DTensors or all plain tensors (this rank's shards)")
    if group is not None or layout != "zigzag":
        raise InputError("with DTensor inputs the mesh gives the group and Shard(2) the layout (contiguous chunks): "
                         "leave group= and layout= out")
    mesh = q.device_mesh
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device_mesh != mesh or mesh.ndim != 1 or tuple(t.placements) != (Shard(2),):
            raise InputError(f"{name} must be sharded on the sequence dim over one 1-D device mesh (placements "
                             f"[Shard(2)]), got mesh {t.device_mesh} and placements {tuple(t.placements)}; "
                             "redistribute it first")
        if t.shape[2] % mesh.size():
            raise InputError(f"{name}'s sequence ({t.shape[2]} positions) must split evenly over the mesh's "
                             f"{mesh.size()} ranks; pad it to a multiple of {mesh.size()}")
    return mesh


def _agree(group, like: torch.Tensor, world: int, facts: tuple) -> None:
    """Every rank must call with the same sizes, layout, exchange, scale, parameter values and block map, or the
    rounds would not match (a hang or a torn message): one all-gather of a digest, on q's device (NCCL needs a
    CUDA tensor; also the group's first collective, as NCCL wants before point-to-point batches)."""
    import hashlib

    digest = int.from_bytes(hashlib.sha256(repr(facts).encode()).digest()[:7], "little")
    mine = torch.tensor([digest], dtype=torch.int64, device=like.device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    if any(int(x) != digest for x in every):
        raise InputError("the ranks called context_parallel_attention with different arguments (local length, batch, "
                         "heads, head dim, dtype, layout, exchange, scale, runtime parameter values or captured "
                         "tensors); every rank of the group must make the same call on its own shard")


class _CPAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, shifted, start, base, plan, exchange, group, scale, *captured):
        global _STATS
        _STATS = CPStats()
        chunk = plan.chunk
        held = _held(plan.rank, plan.world, plan.layout)
        acc = compute_dtype(q.dtype)
        out_acc = q.new_zeros(q.shape[:3] + (v.shape[3],), dtype=acc)
        lse_acc = q.new_full(q.shape[:3], float("-inf"), dtype=acc)
        ring = _Ring(plan, exchange, group, torch.stack([k, v]).contiguous())  # one message per round
        try:
            with torch.no_grad():
                for s in range(plan.world):
                    ring.start(s + 1)  # the next round's K/V in flight during this round's work
                    src = (plan.rank - s) % plan.world
                    pairs = plan.pairs(src)
                    _STATS.pairs_skipped += len(held) * len(_held(src, plan.world, plan.layout)) - len(pairs)
                    if not pairs:
                        continue
                    buf = ring.get(s)
                    for a, b, i, j in pairs:
                        rows = slice(a * chunk, (a + 1) * chunk)
                        keys = slice(b * chunk, (b + 1) * chunk)
                        o, l = torch.ops.attngen.attention_fwd(
                            q[:, :, rows], buf[0][:, :, keys], buf[1][:, :, keys], list(captured), shifted.op_id,
                            scale, i * chunk, _params(shifted, start, j * chunk, base))
                        _merge(out_acc[:, :, rows], lse_acc[:, :, rows], o, l)
                        _STATS.pairs_computed += 1
        finally:
            ring.finish()  # no message left in flight, also when a pair raised
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse_acc, *captured)
        ctx.setup = (shifted, start, base, plan, exchange, group, scale)
        ctx.set_materialize_grads(False)  # dlse None unless the LSE enters the loss: the kernels' common case
        return out, lse_acc

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *captured = ctx.saved_tensors
        shifted, start, base, plan, exchange, group, scale = ctx.setup
        chunk = plan.chunk
        acc = compute_dtype(q.dtype)
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        needs = [True, True, True] + [bool(n) for n in ctx.needs_input_grad[10:]]  # the captured tensors'
        dq = torch.zeros_like(q, dtype=acc)
        dcap = [torch.zeros_like(c, dtype=acc) if n and c.dtype.is_floating_point else None
                for c, n in zip(captured, needs[3:])]
        ring = _Ring(plan, exchange, group, torch.stack([k, v]).contiguous())
        home = _Homeward(plan, group, (2,) + tuple(k.shape), acc, k.device)
        try:
            for s in range(plan.world):
                ring.start(s + 1)
                src = (plan.rank - s) % plan.world
                pairs = plan.pairs(src)
                part = None
                if pairs:
                    buf = ring.get(s)
                    part = torch.zeros_like(buf, dtype=acc)
                    for a, b, i, j in pairs:
                        rows = slice(a * chunk, (a + 1) * chunk)
                        keys = slice(b * chunk, (b + 1) * chunk)
                        g = torch.ops.attngen.attention_bwd(
                            dout[:, :, rows], None if dlse is None else dlse[:, :, rows].contiguous(),
                            q[:, :, rows], buf[0][:, :, keys], buf[1][:, :, keys], out[:, :, rows].contiguous(),
                            lse[:, :, rows].contiguous(), list(captured), shifted.op_id, scale, i * chunk,
                            _params(shifted, start, j * chunk, base), needs)
                        dq[:, :, rows] += g[0].to(acc)
                        part[0][:, :, keys] += g[1].to(acc)
                        part[1][:, :, keys] += g[2].to(acc)
                        for n, d in enumerate(g[3]):
                            if dcap[n] is not None:
                                dcap[n] += d.to(acc)
                home.round(s, part)
            dkv = home.sum()
        finally:
            ring.finish()
        grads = [dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)]
        grads += [None] * 7  # shifted, start, base, plan, exchange, group, scale
        grads += [None if d is None else d.to(c.dtype) for d, c in zip(dcap, captured)]
        return tuple(grads)
