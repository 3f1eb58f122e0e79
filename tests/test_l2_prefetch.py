"""Codec weights pulled into L2 one GEMM ahead (kernels/l2_prefetch.py, codec/weight_prefetch.py).

The kernel's prefetches are hints that Triton's interpreter cannot run (inline PTX), so the
interpreter runs its "plan" mode, the same address arithmetic storing each chunk's (start, size):
the chunks must tile every byte of the tensor once, whatever its length and however many loops of
the grid it takes. The sm_90 PTX carries the predicated bulk prefetch (test_kernel_compile.py).
On the CPU, the wiring: with CUDA's stream calls and the prefetch recorded by fakes, one codec
step asks for each layer's weights in the order the module docstring gives. It asks only at
steps that fit, and joins the side stream once a stage. On a GPU, the audio is bit for bit the
same with prefetch on, eager and graphed.
"""

from __future__ import annotations

import contextlib
import tempfile
import types
from pathlib import Path

import pytest
import torch

from moss_tts.codec import load_codec, tiny_codec_config_dict, write_codec_checkpoint
from moss_tts.codec import weight_prefetch
from moss_tts.codec.transformer import Transformer, TransformerLayer
from moss_tts.kernels import l2_prefetch
from triton_interpreter import interpreter_json

CHUNK = l2_prefetch.CHUNK_BYTES
GRID_CHUNKS = l2_prefetch.NUM_PROGRAMS * l2_prefetch.BLOCK  # chunks one pass of the grid covers
# name -> (shape, dtype, transposed): bytes in whole chunks, a short last chunk, more chunks than
# one pass of the grid, the stored transpose of fused_linear.prepare_weight
PLAN_CASES = {
    "whole_chunks": ((4, CHUNK // 4), torch.bfloat16, False),
    "ragged": ((3, 1000), torch.bfloat16, False),  # 6,000 bytes: one short chunk
    "one_granule": ((8,), torch.bfloat16, False),
    "two_grid_passes": ((GRID_CHUNKS + 3, CHUNK // 2 + 8), torch.bfloat16, False),
    "transposed": ((96, 80), torch.float32, True),
}


def plan_tensor(shape, dtype, transposed: bool) -> torch.Tensor:
    t = torch.zeros(shape, dtype=dtype)
    return t.t().contiguous().t() if transposed else t  # same shape, the other dimension contiguous


def interpreter_main() -> None:
    results = {}
    for name, (shape, dtype, transposed) in PLAN_CASES.items():
        t = plan_tensor(shape, dtype, transposed)
        starts, sizes = l2_prefetch.plan(t)
        results[name] = {"nbytes": t.numel() * t.element_size(), "starts": starts.tolist(), "sizes": sizes.tolist()}
    print(__import__("json").dumps(results))


@pytest.fixture(scope="module")
def plans() -> dict:
    return interpreter_json("test_l2_prefetch", 300)


@pytest.mark.parametrize("name", list(PLAN_CASES))
def test_interpreter_chunks_tile_the_tensor_once(plans, name):
    plan = plans[name]
    nbytes, starts, sizes = plan["nbytes"], plan["starts"], plan["sizes"]
    assert -1 not in starts and -1 not in sizes  # every chunk was planned
    assert starts == [c * CHUNK for c in range(len(starts))]
    assert sizes[:-1] == [CHUNK] * (len(sizes) - 1) and 0 < sizes[-1] <= CHUNK
    assert sum(sizes) == nbytes and all(s % 16 == 0 for s in sizes)  # whole 16-byte granules


def test_cpu_tensors_are_not_prefetched():
    t = torch.zeros(64, 64, dtype=torch.bfloat16)
    assert not l2_prefetch.is_supported(t)
    l2_prefetch.prefetch(t)  # a no-op, not an error


def tiny_codec(device: str = "cpu", dtype=torch.float32, fusion: str = "none", layers: int = 1):
    """The tiny codec in its serving form, with `layers` layers in every transformer stage (2: a
    layer that has a next one, whose in_proj point 2 asks for)."""
    config = tiny_codec_config_dict()
    for stage in config["encoder_kwargs"] + config["decoder_kwargs"]:
        if stage["module_type"] == "Transformer":
            stage["num_layers"] = layers
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_codec_checkpoint(Path(tmp), config, seed=0)
        return load_codec(ckpt, device, dtype).serving_form_(fusion)


def test_rows_out_of_range_are_refused():
    codec = tiny_codec()
    with pytest.raises(ValueError, match="l2_prefetch_rows"):
        codec.l2_prefetch_(weight_prefetch.MAX_ROWS + 1)
    with pytest.raises(ValueError, match="l2_prefetch_rows"):
        codec.l2_prefetch_(-1)


def test_cpu_codec_stays_as_it_was():
    codec = tiny_codec()
    assert codec.l2_prefetch_(64) == 0
    assert all(getattr(m, "prefetch", None) is None for m in codec.modules())


class FakeStream:
    """What LayerPrefetch asks of a CUDA stream, recorded in `log`."""

    def __init__(self, name: str, log: list):
        self.name, self.log, self.device = name, log, torch.device("cpu")

    def wait_stream(self, other: "FakeStream") -> None:
        self.log.append(("wait", self.name, other.name))


@pytest.fixture
def recorded(monkeypatch):
    """The tiny codec with prefetch attached for steps of at most 8 tokens, weight_prefetch's CUDA
    stream calls and the prefetch itself replaced by recorders (monkeypatch undoes them)."""
    log: list = []
    main, side = FakeStream("main", log), FakeStream("side", log)
    current = [main]

    @contextlib.contextmanager
    def on_stream(stream):
        current.insert(0, stream)
        try:
            yield
        finally:
            current.pop(0)

    fake_cuda = types.SimpleNamespace(current_stream=lambda device=None: current[0], stream=on_stream,
                                      Stream=lambda device=None, priority=0: side)
    monkeypatch.setattr(weight_prefetch, "cuda", fake_cuda)  # this module's name for torch.cuda only
    monkeypatch.setattr(l2_prefetch, "is_supported", lambda t: True)
    monkeypatch.setattr(l2_prefetch, "prefetch", lambda t: log.append(("prefetch", current[0].name, id(t))))
    codec = tiny_codec(layers=2)
    assert codec.l2_prefetch_(8) == 8
    return codec, log


def stage_runs(codec, codes) -> list[tuple[int, int]]:
    """(stage, tokens) of every transformer stage one decode step of `codes` runs, in the order
    they run (forward pre-hooks; stage = its index among the codec's Transformer modules)."""
    stages = [m for m in codec.modules() if isinstance(m, Transformer)]
    runs = []
    handles = [stage.register_forward_pre_hook(lambda m, args, i=i: runs.append((i, args[0].shape[:-1].numel())))
               for i, stage in enumerate(stages)]
    try:
        with torch.no_grad():
            codec.decode_step(codes, codec.new_decode_state(codes.shape[0]))
    finally:
        for handle in handles:
            handle.remove()
    return runs


def expected_log(codec, runs: list[tuple[int, int]], rows: int, small_rows: int = 0) -> list[tuple]:
    """The module docstring's order: per fitting stage, per layer, the side stream waits for the
    main one before each point and asks for out_proj and ffn[0], then ffn[2], then the next
    layer's in_proj (none after the last layer); the main stream joins the side one at the
    stage's end. Stages whose steps take the small-GEMM path (at most `small_rows` tokens) ask for
    nothing and join nothing."""
    stages = [m for m in codec.modules() if isinstance(m, Transformer)]
    log = []
    for index, tokens in runs:
        if tokens > rows or tokens <= small_rows:
            continue
        layers = list(stages[index].layers)
        for i, layer in enumerate(layers):
            points = [(layer.self_attn.out_proj.weight, layer.ffn[0].weight), (layer.ffn[2].weight,),
                      (layers[i + 1].self_attn.in_proj.weight,) if i + 1 < len(layers) else ()]
            for weights in points:
                if weights:
                    log += [("wait", "side", "main")] + [("prefetch", "side", id(w)) for w in weights]
        log.append(("wait", "main", "side"))
    return log


def test_a_step_asks_for_each_gemm_weight_in_order_and_joins_once_a_stage(recorded):
    codec, log = recorded
    codes = torch.zeros(1, 2, 12, dtype=torch.long)
    runs = stage_runs(codec, codes)
    # A 1 x 2 step's stages see 2, 4, 8, 16, 32, 64 tokens (test_small_gemm.py): at most 8 rows,
    # some stages prefetch and some do not
    assert any(tokens <= 8 for _, tokens in runs) and any(tokens > 8 for _, tokens in runs)
    assert log == expected_log(codec, runs, 8)  # the hooks' run: the same step
    next_in_proj = {id(m.layers[1].self_attn.in_proj.weight) for m in codec.modules() if isinstance(m, Transformer)}
    assert next_in_proj & {entry[2] for entry in log if entry[0] == "prefetch"}  # point 2 ran
    log.clear()
    with torch.no_grad():
        codec.decode_step(codes, codec.new_decode_state(1))
    assert log == expected_log(codec, runs, 8)
    assert_every_join_follows_a_fork(log)


def assert_every_join_follows_a_fork(log: list[tuple]) -> None:
    """A join with no fork since the last one would wait, in a capture, on work outside it."""
    forked = False
    for entry in log:
        if entry == ("wait", "side", "main"):
            forked = True
        elif entry == ("wait", "main", "side"):
            assert forked, log
            forked = False
    assert not forked, "a fork never joined"


@pytest.mark.parametrize("small_rows", [4, 8])
def test_stages_on_the_small_gemm_path_neither_fork_nor_join(recorded, monkeypatch, small_rows):
    codec, log = recorded
    # the small-GEMM path runs only on a GPU or the interpreter: a stub that leaves x as it is
    monkeypatch.setattr(TransformerLayer, "_small_gemm_forward", lambda self, x, rope, ring: x)
    for layer in (m for m in codec.modules() if isinstance(m, TransformerLayer)):
        monkeypatch.setattr(layer, "small_gemm_rows", small_rows)
    codes = torch.zeros(1, 2, 12, dtype=torch.long)
    runs = stage_runs(codec, codes)
    log.clear()
    with torch.no_grad():
        codec.decode_step(codes, codec.new_decode_state(1))
    assert log == expected_log(codec, runs, 8, small_rows)
    assert_every_join_follows_a_fork(log)
    assert (log == []) == (small_rows == 8)  # 4: the stages of 5-8 tokens still prefetch


def test_a_large_step_asks_for_nothing(recorded):
    codec, log = recorded
    with torch.no_grad():
        codec.decode_step(torch.zeros(4, 10, 12, dtype=torch.long), codec.new_decode_state(4))
    assert log == []


def test_detaching_leaves_no_prefetch(recorded):
    codec, _ = recorded
    assert codec.l2_prefetch_(0) == 0
    assert all(getattr(m, "prefetch", None) is None for m in codec.modules())


@pytest.mark.gpu
def test_gpu_plan_tiles_a_real_weight():
    t = torch.zeros(1280, 5120, dtype=torch.bfloat16, device="cuda")
    starts, sizes = l2_prefetch.plan(t)
    assert int(sizes.sum()) == t.numel() * 2 and int(starts[-1]) == (len(starts) - 1) * CHUNK


@pytest.mark.gpu
def test_gpu_audio_is_the_same_with_prefetch_eager_and_graphed():
    from test_codec import SPF, ring_kernel_audio
    off = tiny_codec("cuda", torch.bfloat16, fusion="ln_lt_gelu")
    on = tiny_codec("cuda", torch.bfloat16, fusion="ln_lt_gelu")
    assert on.l2_prefetch_(weight_prefetch.MAX_ROWS) == weight_prefetch.MAX_ROWS
    torch.manual_seed(1)
    codes = off.encode(0.3 * torch.randn(2, 2, 50 * SPF, device="cuda", dtype=torch.bfloat16), n_quantizers=12)[0]
    # streaming (batched and packed steps): the prefetches change no result
    assert torch.equal(ring_kernel_audio(on, codes, "cuda"), ring_kernel_audio(off, codes, "cuda"))
    # offline, captured in a CUDA graph (the side stream forked and joined inside the capture)
    static = codes[:1, :8].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        on.decode(static)  # outside the capture first: the kernel compiles here
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        with torch.cuda.graph(graph):
            out = on.decode(static)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, off.decode(static))
