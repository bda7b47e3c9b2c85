"""CompiledAttention.__call__'s hot path (a library already loaded for the inputs' dtype, head dim and
device), its control flow checked on the CPU with the launch stubbed out: a TMA-layout refusal goes to
the portable kernel, any other launch error reaches the caller, and odd inputs take the full path."""
import pytest

torch = pytest.importorskip("torch")
import attngen  # noqa: E402
from attngen import frontend  # noqa: E402
from attngen.abi import SM90_FALLBACK_CODES  # noqa: E402
from attngen.errors import KernelLaunchError  # noqa: E402


@pytest.fixture
def hot(monkeypatch):
    attn = attngen.compile(causal=True)
    q = torch.randn(1, 2, 8, 64, dtype=torch.bfloat16)
    lib = object()
    portable = object()
    attn._ready[(q.dtype, 64, q.get_device())] = lib  # as CompiledAttention.library fills it after a first call
    calls = []

    def fake_forward(lib_, q_, k_, v_, **kw):
        calls.append(("forward", lib_, kw))
        if lib_ is lib and isinstance(fake_forward.error, int):
            raise KernelLaunchError("stub", code=fake_forward.error)
        return "portable" if lib_ is portable else "out"

    def fake_library(dtype, head_dim, device_index, kernel=None):
        calls.append(("library", kernel))
        return portable

    fake_forward.error = None
    monkeypatch.setattr(frontend, "forward", fake_forward)
    monkeypatch.setattr(attn, "library", fake_library)
    return attn, q, lib, calls, fake_forward


def test_hot_path_launches_the_ready_library(hot):
    attn, q, lib, calls, _ = hot
    assert attn(q, q, q, scale=0.5, return_lse=True, q_offset=3) == "out"
    assert calls == [("forward", lib, {"scale": 0.5, "q_offset": 3, "return_lse": True, "params": None})]


@pytest.mark.parametrize("code", SM90_FALLBACK_CODES)
def test_tma_refusal_goes_straight_to_the_portable_kernel(hot, code):
    attn, q, _, calls, fake_forward = hot
    fake_forward.error = code
    assert attn(q, q, q, q_offset=2) == "portable"
    assert [c[0] for c in calls] == ["forward", "library", "forward"]
    assert calls[1][1] == "sm80" and calls[2][2]["q_offset"] == 2


def test_other_launch_errors_reach_the_caller(hot):
    attn, q, _, calls, fake_forward = hot
    fake_forward.error = 700  # cudaErrorIllegalAddress
    with pytest.raises(KernelLaunchError):
        attn(q, q, q)
    assert [c[0] for c in calls] == ["forward"]


def test_odd_inputs_take_the_full_path(hot):
    attn, q, _, calls, _ = hot
    with pytest.raises(attngen.InputError):
        attn("not a tensor", q, q)
    out = attn(q.float(), q.float(), q.float())  # no float32 library: the CPU reference runs it
    assert out.shape == q.shape and calls == []
    with pytest.raises(attngen.InputError):
        attn(q, q, q, q_offset=-1)  # a negative offset is refused before any launch
    assert calls == []


def test_launch_failed_names_the_kernel_the_error_and_the_inputs():
    from types import SimpleNamespace

    from attngen.launch import launch_failed

    lib = SimpleNamespace(path="/cache/lib.so", error_string=lambda rc: f"error string of {rc}")
    e = launch_failed(lib, "KV-cache attention kernel", 700, "q (1, 2, 1, 64)")
    assert isinstance(e, KernelLaunchError) and e.code == 700
    assert str(e) == ("launching the KV-cache attention kernel (/cache/lib.so) failed: CUDA error 700 "
                      "(error string of 700); q (1, 2, 1, 64)")
