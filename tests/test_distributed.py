"""attngen.distributed on CPU processes over gloo (2 and 4 ranks): context-parallel forward and backward equal the
single-process attention (float64, reference path) for causal, sliding window, softcap + causal, document ids, a
learnable relative-position bias and GQA, in both layouts and both exchanges; pairs the chunk-level block map
proves empty are not computed and K/V nobody needs is not sent (the counters); shard / unshard round-trip.
"""
import datetime
import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

S, D = 48, 16


def _variants(S):
    import attngen

    gen = torch.Generator().manual_seed(3)
    docs = torch.randint(0, 4, (S,), generator=gen).sort().values
    table = (torch.randn(4, 2 * S - 1, generator=gen) * 0.5).double().requires_grad_()

    def relpos(s, b, h, q, kv):
        return s + table[h, q - kv + S - 1]

    return {
        "causal": (attngen.compile(causal=True), []),
        "sliding_window": (attngen.compile(window=5), []),
        "softcap_causal": (attngen.compile(softcap=3.0, causal=True), []),
        "document": (attngen.compile(mask_mod=attngen.document(docs)), []),
        "relpos": (attngen.compile(score_mod=relpos), [table]),
    }


def _check_one(attn, leaves, layout, exchange, Hq, Hkv, seed):
    import torch.distributed as dist

    from attngen.distributed import context_parallel_attention, last_stats, shard_sequence, unshard_sequence

    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, h, S, D, generator=gen, dtype=torch.float64) for h in (Hq, Hkv, Hkv))
    dout = torch.randn(2, Hq, S, D, generator=gen, dtype=torch.float64)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want, want_lse = attn(*full, return_lse=True)
    want_grads = torch.autograd.grad(want, full + leaves, dout, retain_graph=True)

    local = [shard_sequence(t, layout=layout).requires_grad_() for t in (q, k, v)]
    out, lse = context_parallel_attention(attn, *local, layout=layout, exchange=exchange, return_lse=True)
    dlse = torch.randn(want_lse.shape, generator=gen, dtype=torch.float64).masked_fill(~torch.isfinite(want_lse), 0)
    want_grads = [w + x for w, x in zip(want_grads, torch.autograd.grad(want_lse, full + leaves, dlse,
                                                                        allow_unused=True, materialize_grads=True))]
    grads = torch.autograd.grad((out, lse), local + leaves, (shard_sequence(dout, layout=layout),
                                                             shard_sequence(dlse, layout=layout)))
    stats = last_stats()  # the forward's pairs, the forward's and backward's K/V messages
    got = unshard_sequence(out.detach(), layout=layout)
    torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-10)
    fin = torch.isfinite(want_lse)
    got_lse = unshard_sequence(lse.detach(), layout=layout)
    assert torch.equal(torch.isfinite(got_lse), fin)
    torch.testing.assert_close(got_lse[fin], want_lse.detach()[fin], rtol=0, atol=1e-10)
    for n, (g, w) in enumerate(zip(grads[:3], want_grads[:3])):
        torch.testing.assert_close(unshard_sequence(g, layout=layout), w, rtol=0, atol=1e-10, msg=f"d{'qkv'[n]}")
    for g, w in zip(grads[3:], want_grads[3:]):  # captured tensors: each rank's share, summed over the group
        g = g.clone()
        dist.all_reduce(g)
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)
    return stats


def _check_dtensor(attn, world):
    """DTensors sharded on the sequence dim (Shard(2)) over a 1-D mesh: the same results, as DTensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from attngen.distributed import context_parallel_attention

    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(21)
    q, k, v, dout = (torch.randn(2, h, S, D, generator=gen, dtype=torch.float64) for h in (4, 2, 2, 4))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = attn(*full)
    want_grads = torch.autograd.grad(want, full, dout)
    dts = [distribute_tensor(t, mesh, [Shard(2)]).requires_grad_() for t in (q, k, v)]
    out = context_parallel_attention(attn, *dts)
    assert tuple(out.placements) == (Shard(2),)
    grads = torch.autograd.grad(out, dts, distribute_tensor(dout, mesh, [Shard(2)]))
    torch.testing.assert_close(out.full_tensor(), want.detach(), rtol=0, atol=1e-10)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g.full_tensor(), w, rtol=0, atol=1e-10)


def _worker(rank, world, init_file, failures):
    import faulthandler

    import torch.distributed as dist

    faulthandler.enable()  # a native abort in a rank prints where it was

    if "ATTNGEN_CACHE_DIR" not in os.environ:  # inherited from the test session's isolated one, normally
        os.environ["ATTNGEN_CACHE_DIR"] = tempfile.mkdtemp()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))  # a mismatched round fails, not hangs
    try:
        from attngen.distributed import _n_chunks, _plan, shard_sequence, unshard_sequence

        x = torch.arange(2 * 3 * S * 2, dtype=torch.float32).view(2, 3, S, 2)
        for layout in ("zigzag", "contiguous"):
            assert torch.equal(unshard_sequence(shard_sequence(x, layout=layout), layout=layout), x)
        V = _variants(S)
        for n, (name, (attn, leaves)) in enumerate(V.items()):
            layout = ("zigzag", "contiguous")[n % 2]
            exchange = ("p2p", "allgather")[(n // 2) % 2]
            Hq, Hkv = (4, 2) if n % 2 else (4, 4)
            stats = _check_one(attn, leaves, layout, exchange, Hq, Hkv, seed=n)
            plan = _plan(attn, world, rank, layout, S // _n_chunks(world, layout), 2, Hq)
            # every live pair computed, every proven-empty one skipped, across the group
            counts = torch.tensor([stats.pairs_computed, stats.pairs_skipped])
            dist.all_reduce(counts)
            live = int(plan.live.sum())
            assert counts.tolist() == [live, plan.live.numel() - live], (name, counts.tolist(), live)
        # the plan follows what the block map reads: the heads (a per-head window), a runtime parameter's value
        # and a captured tensor's contents changed in place between calls
        import attngen

        def per_head(b, h, q, kv):
            return (q >= kv) & (q - kv < 3 + 20 * h)

        _check_one(attngen.compile(mask_mod=attngen.MaskMod(per_head, "per_head")), [], "contiguous", "p2p", 4, 4, 11)
        w = attngen.param("w", 3, minimum=1)

        def window(b, h, q, kv):
            return (q >= kv) & (q - kv < w)

        attn = attngen.compile(mask_mod=attngen.MaskMod(window, "window"))
        _check_one(attn, [], "contiguous", "p2p", 2, 2, 12)
        w.set(40)
        _check_one(attn, [], "contiguous", "p2p", 2, 2, 13)
        docs = torch.zeros(S, dtype=torch.int64)
        attn = attngen.compile(mask_mod=attngen.document(docs))
        _check_one(attn, [], "zigzag", "p2p", 2, 2, 14)
        docs.copy_(torch.arange(S) // 7)
        _check_one(attn, [], "zigzag", "p2p", 2, 2, 15)
        _check_dtensor(V["relpos"][0], world)
        # a sliding window over contiguous chunks: each rank needs its own keys and its left neighbour's only
        attn = V["sliding_window"][0]
        stats = _check_one(attn, [], "contiguous", "p2p", 2, 2, seed=9)
        sends = torch.tensor([stats.kv_sends, stats.kv_sends_skipped])
        dist.all_reduce(sends)
        # forward and backward each: round 1 sends to the right neighbour (not from the last rank), no other round sends
        assert sends.tolist() == [2 * (world - 1), 2 * (world - 1) ** 2], sends.tolist()
    except BaseException as e:  # noqa: BLE001  (reported by the parent)
        failures.put(f"rank {rank}: {type(e).__name__}: {e}")
        dist.destroy_process_group()
        raise
    dist.barrier()  # no rank leaves while another still talks to it
    dist.destroy_process_group()
    # gloo's threads sometimes abort the interpreter's teardown ("terminate called without an active exception")
    # after everything passed: leave without it
    os._exit(0)


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_equals_one_process(world, tmp_path):
    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    try:
        mp.spawn(_worker, args=(world, str(tmp_path / "init"), failures), nprocs=world, join=True)
    except mp.ProcessRaisedException as e:
        msgs = []
        while not failures.empty():
            msgs.append(failures.get())
        pytest.fail("\n".join(msgs) or str(e))
