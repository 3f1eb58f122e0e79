"""The one-kernel codebook draw (kernels/sample_kernel.py) against the torch path: on CPU through
Triton's interpreter (a few rows, one subprocess, since TRITON_INTERPRET must be set before triton
is imported), the reference against the engine's own unstable-sort path, and on a GPU at the
engine's sizes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from moss_tts.kernels.fused import penalized_scores, select_stop
from moss_tts.kernels.sample_kernel import draw_tokens, is_supported, reference_draw
from moss_tts.model.sampler import ChannelTensors, counter_hash, draw, gumbel_noise, temperature_scores
from triton_interpreter import run_interpreter_main

INTERPRETER_TIMEOUT_S = 300
GPU_MIN_AGREEMENT = 0.995  # rows may differ only where a cumulative probability lies within rounding of top_p

# (temperature, top_k, top_p, repetition penalty) per row, cycled over a case's rows: greedy,
# top_k off (0, -1) / over V / 1, top_p off / tiny, penalty off / on, temperatures 0, 0.5, 1.0, 1.7
PARAM_ROWS = [
    (0.0, 25, 0.8, 1.0), (0.0, 0, 1.0, 1.3), (1.7, 25, 0.8, 1.0), (1.7, 25, 0.8, 1.3),
    (0.5, 0, 1.0, 1.0), (0.5, 2000, 0.95, 1.3), (1.7, 1, 1.0, 1.0), (1.7, -1, 0.01, 1.3),
    (1.0, 0, 0.5, 1.0), (0.5, 50, 0.9, 1.3), (1.7, 0, 0.8, 1.0), (1.7, 3, 1.0, 1.3),
    (1.0, 10, 0.3, 1.0), (0.5, 25, 1.0, 1.3), (1.7, 200, 0.99, 1.0), (0.0, 1, 0.01, 1.3),
]
DEFAULT_ROW = (1.7, 25, 0.8, 1.0)

# name -> (rows, vocab, dtype, logits kind, has seen, params); kinds are described in make_logits
INTERPRETER_CASES = {
    "bf16_mixed": (16, 1024, "bfloat16", "normal", True, "mixed"),
    "bf16_heavy_ties": (16, 1024, "bfloat16", "ties", True, "mixed"),
    "stop_head_bf16": (16, 2, "bfloat16", "stop", False, "mixed"),
    "f32_vocab_1000_strided_neg_inf": (6, 1000, "float32", "neg_inf", True, "mixed"),
    "f16_defaults": (4, 1024, "float16", "normal", True, "defaults"),
    # a NaN with the sign bit set orders below -inf (outside the 32 best) yet survives top-k in
    # the full draw: the top-k path must not take such rows
    "f32_negative_nan_top_k_2": (4, 64, "float32", "negative_nan", False, (1.3, 2, 1.0, 1.0)),
}
NOISE_SEEDS = [0, 1, 2**40 + 5, -1, 2**63 - 1, -2**63, 2**31 - 1, 123456789]
NOISE_POSITIONS = [0, 1, 12, 2**31 + 7, 5, 999_999, 2**40, 13]


def make_logits(rows: int, vocab: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """normal: N(0, 2.5^2) (bf16 rounding makes ties); ties: 9 distinct values, and rows 0, 7 and
    12 all equal, so top-k and the top-p cut fall inside tie groups; stop: rows 0 and 5 equal
    logits; neg_inf: ~5% -inf, as masked codes; negative_nan: code 3 of every row a NaN with its sign bit set."""
    logits = torch.randn(rows, vocab, generator=gen) * 2.5
    if kind == "ties":
        logits = torch.randint(-6, 3, (rows, vocab), generator=gen) * 0.75
        logits[[0, 7, 12]] = 0.0
    elif kind == "stop":
        logits[[0, 5], 1] = logits[[0, 5], 0]
    elif kind == "neg_inf":
        logits[torch.rand(rows, vocab, generator=gen) < 0.05] = float("-inf")
    elif kind == "negative_nan":
        logits[:, 3] = -torch.tensor(float("nan"))
        assert torch.signbit(logits[:, 3]).all()
    return logits


def make_case(rows: int, vocab: int, dtype: str, kind: str, has_seen: bool, params: str | tuple,
              device: str = "cpu", seed: int = 0):
    """The draw_tokens arguments of one case; strided logits and seen where vocab is not a power of two."""
    gen = torch.Generator().manual_seed(seed)
    logits = make_logits(rows, vocab, kind, gen).to(device=device, dtype=getattr(torch, dtype))
    seen = (torch.rand(rows, vocab, generator=gen) < 0.1).to(device) if has_seen else None
    if vocab & (vocab - 1):
        logits, seen = _strided(logits), _strided(seen)
    table = ([PARAM_ROWS[r % len(PARAM_ROWS)] for r in range(rows)] if params == "mixed"
             else [params] * rows if isinstance(params, tuple) else [DEFAULT_ROW] * rows)
    temperature, top_k, top_p, penalty = (torch.tensor(col, device=device) for col in zip(*table))
    seeds = torch.randint(-2**62, 2**62, (rows,), generator=gen).to(device)
    positions = torch.randint(0, 2**20, (rows,), generator=gen).to(device)
    return logits, seen, penalty, temperature, top_k, top_p, seeds, positions


def _strided(x: torch.Tensor | None) -> torch.Tensor | None:
    """x in row 1 of a [B, 3, V] buffer, as seen[:, c] of the engine's [B, n_vq, V]: row stride 3V."""
    if x is None:
        return None
    full = torch.zeros(x.shape[0], 3, x.shape[1], dtype=x.dtype, device=x.device)
    full[:, 1] = x
    return full[:, 1]


def top_p_margin(args, row: int) -> float:
    """How close the reference's cumulative probabilities come to top_p at this row (the only place
    the kernel's summation order may change the result): min |cumulative - top_p|; inf where no cut is made."""
    logits, seen, penalty, temperature, top_k, top_p, _, _ = (a[row:row + 1].cpu() if a is not None else None
                                                              for a in args)
    if float(temperature) == 0 or float(top_p) >= 1.0:  # greedy, or top-p off
        return float("inf")
    if seen is None:
        _, scaled, _ = temperature_scores(logits, temperature)
    else:
        _, scaled, _ = penalized_scores(logits, seen, penalty, temperature)
    sorted_scores = torch.sort(scaled, dim=-1, descending=True, stable=True).values
    k = int(top_k) if 0 < int(top_k) <= scaled.shape[-1] else scaled.shape[-1]
    sorted_scores = sorted_scores.masked_fill(sorted_scores < sorted_scores[0, k - 1], float("-inf"))
    cumulative = torch.softmax(sorted_scores, dim=-1).cumsum(dim=-1)
    return float((cumulative - top_p).abs().min())


def describe_mismatches(args, got: torch.Tensor, want: torch.Tensor) -> str:
    rows = (got.cpu() != want.cpu()).nonzero().flatten().tolist()
    lines = [f"{len(rows)} of {len(got)} rows differ"]
    for r in rows:
        params = {name: float(args[i][r]) for i, name in ((3, "T"), (4, "top_k"), (5, "top_p"), (2, "penalty"))}
        margin = top_p_margin(args, r)
        kind = "a top-p boundary case" if margin < 1e-6 else "NOT a top-p boundary case"
        lines.append(f"  row {r}: kernel {int(got[r])}, reference {int(want[r])}, {params}; "
                     f"nearest cumulative to top_p {margin:.2e} away: {kind}")
    return "\n".join(lines)


def noise_inputs(device: str = "cpu"):
    return torch.tensor(NOISE_SEEDS, device=device), torch.tensor(NOISE_POSITIONS, device=device)


def torch_noise(seed: torch.Tensor, position: torch.Tensor, vocab: int):
    token = torch.arange(vocab, device=seed.device).expand(seed.shape[0], vocab)
    return counter_hash(seed, position, token), gumbel_noise(seed, position, token)


def interpreter_main(out_path: str) -> None:
    """Run in a subprocess with TRITON_INTERPRET=1: saves the kernel's tokens per case and its noise."""
    from moss_tts.kernels import sample_kernel

    _numpy_xor_reduce()
    results = {}
    for name, case in INTERPRETER_CASES.items():
        args = make_case(*case)
        assert sample_kernel.is_supported(args[0]), f"{name}: the kernel would not run (fallback)"
        results[name] = sample_kernel.draw_tokens(*args)
    for vocab in (1024, 3):
        results[f"noise_{vocab}"] = sample_kernel.kernel_noise(*noise_inputs(), vocab)
    torch.save(results, out_path)


def _numpy_xor_reduce() -> None:
    """Speed only: Triton 3.6's interpreter runs xor_sum (tl.sort's compare-and-swap) one element at
    a time through Python, ~1.5 s per 1024-wide row; numpy's xor reduce gives the same integers."""
    import triton.language as tl
    from triton.runtime import interpreter

    slow = interpreter.ReduceOps.apply_impl
    xor_combine = getattr(tl.standard, "_xor_combine", None)

    def apply_impl(self, input):
        if xor_combine is not None and self.combine_fn == xor_combine:
            data = np.bitwise_xor.reduce(input[0].handle.data, axis=self.axis, keepdims=self.keep_dims)
            return self.to_tensor(data, input[0].dtype)
        return slow(self, input)
    interpreter.ReduceOps.apply_impl = apply_impl


@pytest.fixture(scope="module")
def interpreter_results(tmp_path_factory) -> dict:
    out_path = tmp_path_factory.mktemp("sample_kernel") / "results.pt"
    run_interpreter_main("test_sample_kernel", repr(str(out_path)), INTERPRETER_TIMEOUT_S)
    return torch.load(out_path)


@pytest.mark.parametrize("name", list(INTERPRETER_CASES))
def test_interpreter_kernel_matches_reference(interpreter_results, name):
    args = make_case(*INTERPRETER_CASES[name])
    got, want = interpreter_results[name], reference_draw(*args)
    assert got.dtype == torch.long and got.shape == want.shape
    assert torch.equal(got, want), describe_mismatches(args, got, want)


@pytest.mark.parametrize("vocab", [1024, 3])
def test_interpreter_noise_port_is_exact(interpreter_results, vocab):
    """Hash: bit for bit. Noise: bit for bit the same float64 ops on torch's own uniform u; only the
    log itself is the platform's (numpy's in the interpreter, Sleef's in torch on CPU, which differ
    in the last bit), so against torch the check is 2 ulp. On a GPU both call libdevice: see
    test_gpu_noise_is_bit_identical."""
    hashes, noise = interpreter_results[f"noise_{vocab}"]
    want_hashes, want_noise = torch_noise(*noise_inputs(), vocab)
    assert torch.equal(hashes, want_hashes)
    u = ((want_hashes.double() + 0.5) / 4294967296.0).numpy()
    assert np.array_equal(noise.numpy(), -np.log(-np.log(u)))
    got, want = noise.numpy(), want_noise.numpy()
    assert (np.abs(got - want) <= 2 * np.spacing(np.maximum(np.abs(want), 1.0))).all()


def test_reference_equals_the_engines_unstable_sort_without_ties():
    """reference_draw's only change to the engine (frame._draw: fused.* around torch.sort) is the
    stable sort, which matters only for equal scores; float32 random logits have none."""
    from moss_tts.engine.frame import _draw

    for vocab, select in ((1024, draw), (2, select_stop)):
        args = make_case(64, vocab, "float32", "normal", vocab > 2, "mixed", seed=1)
        logits, seen, penalty, temperature, top_k, top_p, seeds, positions = args
        params = ChannelTensors(temperature, top_p, top_k, penalty)
        if seen is None:
            scores, scaled, is_greedy = temperature_scores(logits, temperature)
        else:
            scores, scaled, is_greedy = penalized_scores(logits, seen, penalty, temperature)
        assert all(len(set(row.tolist())) == vocab for row in scaled), "the premise: no ties"
        engine = _draw(select, scores, scaled, is_greedy, params, seeds, positions)
        assert torch.equal(reference_draw(*args), engine)


def test_reference_orders_ties_by_id():
    """All-equal scores: greedy takes id 0; top_p 0.01 keeps ids 0..10 (cumulative k/1024, exact)."""
    rows = 64
    logits, seen = torch.zeros(rows, 1024), torch.zeros(rows, 1024, dtype=torch.bool)
    ones, top_k_off = torch.ones(rows), torch.zeros(rows, dtype=torch.long)
    seeds, positions = torch.arange(rows), torch.arange(rows)
    greedy = reference_draw(logits, seen, ones, ones * 0, top_k_off, ones, seeds, positions)
    tiny_p = reference_draw(logits, seen, ones, ones, top_k_off, ones * 0.01, seeds, positions)
    assert greedy.eq(0).all() and tiny_p.le(10).all() and len(set(tiny_p.tolist())) > 5


def test_cpu_without_interpreter_falls_back_to_reference():
    args = make_case(8, 1024, "bfloat16", "normal", True, "mixed")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process runs the interpreter: the kernel itself is used")
    assert not is_supported(args[0])
    assert torch.equal(draw_tokens(*args), reference_draw(*args))


# The engine's sizes on CUDA: 256 rows, 12 codebooks of 1024, bf16 logits.
GPU_CASES = {
    "defaults": (256, 1024, "bfloat16", "normal", True, "defaults"),
    "mixed": (256, 1024, "bfloat16", "normal", True, "mixed"),
    "heavy_ties": (256, 1024, "bfloat16", "ties", True, "mixed"),
    "stop_head": (256, 2, "bfloat16", "stop", False, "mixed"),
    "vocab_1000_strided": (256, 1000, "float32", "neg_inf", True, "mixed"),
    "vocab_4096": (64, 4096, "bfloat16", "normal", True, "mixed"),  # MAX_VOCAB
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_kernel_matches_reference(name):
    args = make_case(*GPU_CASES[name], device="cuda")
    got, want = draw_tokens(*args), reference_draw(*args)
    agreement = float((got == want).float().mean())
    if agreement < 1.0:
        print(f"\n{name}: " + describe_mismatches(args, got, want))
    assert agreement >= GPU_MIN_AGREEMENT, describe_mismatches(args, got, want)


@pytest.mark.gpu
def test_gpu_noise_is_bit_identical():
    from moss_tts.kernels.sample_kernel import kernel_noise

    for vocab in (1024, 3):
        hashes, noise = kernel_noise(*noise_inputs("cuda"), vocab)
        want_hashes, want_noise = torch_noise(*noise_inputs("cuda"), vocab)
        assert torch.equal(hashes, want_hashes) and torch.equal(noise, want_noise)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_follows_new_inputs():
    args = make_case(*GPU_CASES["mixed"], device="cuda")
    new_args = make_case(*GPU_CASES["mixed"], device="cuda", seed=1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        draw_tokens(*args)  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = draw_tokens(*args)
    for arg, new in zip(args, new_args):
        arg.copy_(new)
    graph.replay()
    assert torch.equal(out, draw_tokens(*new_args))
