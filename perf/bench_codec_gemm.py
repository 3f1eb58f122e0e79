"""Codec GEMM benchmark: torch's LayerNorm -> cuBLAS linear (-> GELU) against kernels/fused_linear.py.

    PYTHONPATH=python_backends:. python3 perf/bench_codec_gemm.py --out gemm.json            # H200, ~1-2 min
    PYTHONPATH=python_backends:. python3 perf/bench_codec_gemm.py --sweep --out sweep.json   # + tile sweep, ~4 min
    PYTHONPATH=python_backends:. python3 perf/bench_codec_gemm.py --device cpu --tiny        # CPU smoke of the script
    (TRITON_INTERPRET=1 in front of the last runs the kernel itself in the interpreter: slow, fp32.)

Per codec stage shape (d 1280 / ff 5120, the first decoder stage; d 768 / ff 3072, the five after
it) and per token count M, four GEMMs of a layer:
  in_proj  norm1 -> in_proj       [M, d] x [3d, d]^T   fused: LayerNorm prologue
  ffn0     norm2 -> ffn[0] -> GELU [M, d] x [ff, d]^T   fused: LayerNorm prologue + GELU epilogue
  plain    in_proj's GEMM alone                          the kernel's GEMM core against cuBLAS
  residual r += ffn[2]            [M, ff] x [d, ff]^T  fused: residual epilogue (addmm_ in torch)
Columns: torch (F.layer_norm, F.linear with W as nn.Linear stores it, F.gelu; addmm_), served (what
the served fusion runs: kernels/layer_norm.py's norm, cuBLAS, the GELU in cuBLASLt's epilogue;
addmm_), fused with the prepared N-major weight, fused_k with nn.Linear's layout (what the
small-GEMM path of codec.transformer runs); ms per call (median of --iters replays of a CUDA graph
of --reps calls), TFLOP/s of the GEMM (2 M N K / time), and max |fused - torch| relative to max
|torch|. Few-token rows are the small-GEMM path's question: fused_k against served there. Every call reads a fresh
copy of its operands, rotating over >= 128 MiB of them, so few-token GEMMs read W from HBM as
the codec's layers do, not from L2.
--sweep times candidate tiles per (shape, op, M) (fused; N-major above FEW_ROWS, nn.Linear's layout
at or below it, as each regime serves) and prints, per kernel kind, the table that minimizes the
summed time at each M, ready to paste into CONFIG_TABLE.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from moss_tts.kernels import layer_norm
from moss_tts.kernels.fused_linear import (CONFIG_TABLE, GemmConfig, fused_linear, gemm_config, is_supported,
                                           kernel_kind, prepare_weight, reference_fused_linear)
from perf.graph_timing import graph_ms

CODEC_SHAPES = ((1280, 5120), (768, 3072))  # (d, ff)
ROWS = (2, 4, 8, 16, 32, 64, 640, 2560, 10240, 40960, 81920)
TINY_SHAPES, TINY_ROWS = ((64, 128),), (2, 37)
# op -> (norm, gelu, residual)
OPS = {"in_proj": (True, False, False), "ffn0": (True, True, False), "plain": (False, False, False),
       "residual": (False, False, True)}
ROTATE_BYTES = 128 * 2**20  # operands cycled per graph: over twice the H200's 50 MB L2
EPS = 1e-5
# Tile candidates of the sweep, by regime: few rows are bound by reading W (narrow tiles, many
# programs), many rows by the tensor cores (wide tiles). Kept short: each compiles per kernel kind.
FEW_ROWS = 64
TINY_ROWS_MAX = 16  # at most this many: 16-row tiles (mma.sync), the small-GEMM path's first stages
# Few rows read W with few programs when N is small (ffn[2] / out_proj: N = d, 24-80 programs of
# 32 columns), so some candidates keep more of W in flight per program (256-deep K tiles, narrow
# N): all compile for sm_90 without spills (at most 255 registers with the norm prologue).
SWEEP_TINY = (GemmConfig(16, 32, 64, 4, 4), GemmConfig(16, 32, 128, 4, 4), GemmConfig(16, 64, 64, 4, 4),
              GemmConfig(16, 64, 128, 4, 4), GemmConfig(16, 16, 128, 4, 4), GemmConfig(16, 32, 128, 2, 4),
              GemmConfig(16, 16, 128, 2, 4), GemmConfig(16, 16, 256, 2, 4), GemmConfig(16, 32, 256, 4, 3),
              GemmConfig(16, 32, 128, 4, 4, split_k=4), GemmConfig(16, 64, 128, 4, 4, split_k=4),
              GemmConfig(16, 32, 128, 4, 4, split_k=8))
SWEEP_FEW = (GemmConfig(64, 32, 128, 4, 4), GemmConfig(64, 64, 64, 4, 4), GemmConfig(64, 64, 128, 4, 4),
             GemmConfig(64, 128, 64, 4, 4), GemmConfig(64, 32, 256, 4, 3), GemmConfig(64, 32, 128, 4, 4, split_k=4),
             GemmConfig(64, 64, 128, 4, 4, split_k=4))
SWEEP_MANY = (GemmConfig(64, 128, 64, 4, 4), GemmConfig(128, 128, 64, 8, 3), GemmConfig(128, 128, 64, 8, 4),
              GemmConfig(128, 256, 64, 8, 3), GemmConfig(128, 256, 64, 8, 4))
CANDIDATES = {str(c): c for c in SWEEP_TINY + SWEEP_FEW + SWEEP_MANY}  # a sweep's results name tiles by str()


@dataclass(frozen=True)
class Case:
    d: int
    ff: int
    op: str
    rows: int

    @property
    def k(self) -> int:
        return self.ff if self.has_residual else self.d

    @property
    def n(self) -> int:
        return self.d if self.has_residual else self.ff if self.op == "ffn0" else 3 * self.d

    @property
    def has_norm(self) -> bool:
        return OPS[self.op][0]

    @property
    def gelu(self) -> bool:
        return OPS[self.op][1]

    @property
    def has_residual(self) -> bool:
        return OPS[self.op][2]

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * self.n * self.k


@dataclass(frozen=True)
class Operands:
    x: torch.Tensor
    weight: torch.Tensor  # nn.Linear's layout, [N, K] K-contiguous
    weight_n_major: torch.Tensor  # prepare_weight(weight)
    norm: tuple  # (gamma, beta) or (None, None)
    residual: torch.Tensor | None  # [M, N], added to in place by the residual op
    gelu_bias: torch.Tensor  # zeros [N]: cuBLASLt's GELU epilogue needs a bias


def make_operands(case: Case, dtype: torch.dtype, device: torch.device) -> list[Operands]:
    """Enough independent copies that one graph's calls stream >= ROTATE_BYTES."""
    size = torch.empty((), dtype=dtype).element_size()
    per_call = (case.rows * case.k + case.n * case.k + case.rows * case.n) * size
    gen = torch.Generator(device).manual_seed(0)

    def randn(*shape):  # on the device: ~1 GB of operands per case would take seconds on the host
        return torch.randn(*shape, generator=gen, device=device)

    copies = []
    for _ in range(max(1, min(32, math.ceil(ROTATE_BYTES / per_call)))):
        x = (randn(case.rows, case.k) * 2).to(dtype)
        weight = (randn(case.n, case.k) / case.k ** 0.5).to(dtype)
        gamma = (1 + 0.2 * randn(case.k)).to(dtype)
        beta = (0.2 * randn(case.k)).to(dtype)
        residual = (randn(case.rows, case.n) * 2).to(dtype) if case.has_residual else None
        copies.append(Operands(x, weight, prepare_weight(weight), (gamma, beta) if case.has_norm else (None, None),
                               residual, torch.zeros(case.n, dtype=dtype, device=device)))
    return copies


def torch_call(case: Case, ops: Operands) -> torch.Tensor:
    return reference_fused_linear(ops.x, ops.weight, *ops.norm, EPS, case.gelu, ops.residual)


def served_call(case: Case, ops: Operands) -> torch.Tensor:
    """What TransformerLayer runs for this GEMM under the served fusion (ln_lt_gelu) on a GPU."""
    if case.has_residual:
        return ops.residual.addmm_(ops.x, ops.weight.t())
    x = layer_norm.layer_norm(ops.x, *ops.norm, EPS) if case.has_norm else ops.x
    if case.gelu and x.is_cuda:  # cuBLASLt's bias + GELU (tanh) epilogue; CUDA only
        return torch._addmm_activation(ops.gelu_bias, x, ops.weight.t(), use_gelu=True)
    y = torch.nn.functional.linear(x, ops.weight)
    return torch.nn.functional.gelu(y) if case.gelu else y


def fused_call(case: Case, ops: Operands, n_major: bool = True, config: GemmConfig | None = None) -> torch.Tensor:
    weight = ops.weight_n_major if n_major else ops.weight
    return fused_linear(ops.x, weight, *ops.norm, EPS, case.gelu, config, ops.residual)


def ms_per_call(call, copies: list[Operands], device: torch.device, reps: int, iters: int) -> float:
    """Median over `iters` of (time of `reps` calls, cycling over the copies) / reps. CUDA: one
    graph of the reps calls (no launch gaps, as the server's graphs), timed by events."""
    if device.type != "cuda":
        call(copies[0])  # as on CUDA: the first call (compilation) is not timed
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            for i in range(reps):
                call(copies[i % len(copies)])
            times.append((time.perf_counter() - start) * 1e3 / reps)
        return statistics.median(times)
    return graph_ms(lambda i: call(copies[i % len(copies)]), reps, iters)


def measure(case: Case, dtype, device, reps: int, iters: int) -> dict:
    copies = make_operands(case, dtype, device)
    before = None if copies[0].residual is None else copies[0].residual.clone()
    expected = torch_call(case, copies[0]).float().clone()  # fp32 runs: .float() is the residual itself
    if before is not None:  # the residual ops add in place: the kernel starts from the same residual
        copies[0].residual.copy_(before)
    got = fused_call(case, copies[0]).float()
    row = {**asdict(case), "n": case.n, "k": case.k, "copies": len(copies),
           "kernel": "triton" if is_supported(copies[0].x, copies[0].weight) else "reference",
           "config": str(gemm_config(case.rows, case.has_norm)),
           "max_abs_diff": (got - expected).abs().max().item(), "max_abs_torch": expected.abs().max().item()}
    row["rel_diff"] = row["max_abs_diff"] / max(row["max_abs_torch"], 1e-30)
    for name, call in (("torch", lambda o: torch_call(case, o)), ("served", lambda o: served_call(case, o)),
                       ("fused", lambda o: fused_call(case, o)), ("fused_k", lambda o: fused_call(case, o, n_major=False))):
        ms = ms_per_call(call, copies, device, reps, iters)
        row[f"{name}_ms"], row[f"{name}_tflops"] = ms, case.flops / ms / 1e9
    return row


def sweep(case: Case, dtype, device, reps: int, iters: int) -> dict:
    copies = make_operands(case, dtype, device)
    candidates = SWEEP_TINY if case.rows <= TINY_ROWS_MAX else SWEEP_FEW if case.rows <= FEW_ROWS else SWEEP_MANY
    n_major = case.rows > FEW_ROWS  # few rows: the small-GEMM path's nn.Linear layout
    times = {str(c): ms_per_call(lambda o, c=c: fused_call(case, o, n_major, config=c), copies, device, reps, iters)
             for c in candidates}
    return {**asdict(case), "kind": kernel_kind(case.has_norm), "ms": times, "best": min(times, key=times.get)}


def best_table(sweeps: list[dict]) -> dict[str, list[tuple[int, str]]]:
    """Per kernel kind: at each M the candidate of least summed time over its shapes and ops,
    consecutive Ms with the same winner merged into one (most rows, tiles) entry."""
    table = {}
    for kind in sorted({s["kind"] for s in sweeps}):
        entries: list[tuple[int, str]] = []
        for rows in sorted({s["rows"] for s in sweeps if s["kind"] == kind}):
            ofs = [s["ms"] for s in sweeps if s["kind"] == kind and s["rows"] == rows]
            best = min(ofs[0], key=lambda c: sum(ms[c] for ms in ofs))
            if entries and entries[-1][1] == best:
                entries.pop()
            entries.append((rows, best))
        table[kind] = entries[:-1] + [(2**62, entries[-1][1])]
    return table


def format_rows(rows: list[dict]) -> str:
    head = (f"{'d':>5} {'op':>8} {'M':>6} {'torch ms':>9} {'served':>9} {'fused ms':>9} {'fused_k':>9} "
            f"{'speedup':>7} {'torch TF/s':>10} {'fused TF/s':>10} {'rel diff':>9}  tiles")
    lines = [head]
    for r in rows:
        lines.append(f"{r['d']:>5} {r['op']:>8} {r['rows']:>6} {r['torch_ms']:>9.4f} {r['served_ms']:>9.4f} "
                     f"{r['fused_ms']:>9.4f} {r['fused_k_ms']:>9.4f} {r['torch_ms'] / r['fused_ms']:>7.2f} "
                     f"{r['torch_tflops']:>10.1f} {r['fused_tflops']:>10.1f} {r['rel_diff']:>9.2e}  {r['config']}")
    return "\n".join(lines)


def format_table(table: dict[str, list[tuple[int, str]]]) -> str:
    """The sweep's table as fused_linear.CONFIG_TABLE's source."""
    lines = ["# least summed time per M, from perf/bench_codec_gemm.py --sweep", "CONFIG_TABLE = {"]
    for kind, entries in table.items():
        items = [f"({'2**62' if rows == 2**62 else rows}, GemmConfig({c.block_m}, {c.block_n}, {c.block_k}, "
                 f"{c.num_warps}, {c.num_stages}{f', split_k={c.split_k}' if c.split_k > 1 else ''}))"
                 for rows, c in ((r, CANDIDATES[t]) for r, t in entries)]
        lines.append(f'    "{kind}": (' + ",\n".ljust(len(kind) + 11).join(items) + ",),")  # a tuple even of one
    return "\n".join(lines + ["}"])


def table_with_sweep(results: dict) -> dict[str, tuple[tuple[int, GemmConfig], ...]]:
    """fused_linear.CONFIG_TABLE with a sweep's choices (the JSON this script wrote with --sweep) up
    to the most rows it swept, and the table's own entries above that: what bench_vocoder.py
    --gemm-table serves, so a sweep of few rows is tried in the whole codec in the same call."""
    most = max(s["rows"] for s in results["sweep"])
    table = {}
    for kind, entries in CONFIG_TABLE.items():
        swept = [(min(rows, most), CANDIDATES[name]) for rows, name in results["table"].get(kind, [])]
        table[kind] = tuple(swept + [(rows, config) for rows, config in entries if rows > most])
    return table


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="one tiny shape in fp32 (CPU smoke)")
    p.add_argument("--rows", default=None, help="comma-separated token counts M (default: the codec's list)")
    p.add_argument("--reps", type=int, default=20, help="calls per timed graph")
    p.add_argument("--iters", type=int, default=10, help="timed replays (median)")
    p.add_argument("--sweep", action="store_true", help="also time the candidate tiles and print the best table")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    shapes = TINY_SHAPES if args.tiny else CODEC_SHAPES
    rows_list = [int(r) for r in args.rows.split(",")] if args.rows else (TINY_ROWS if args.tiny else ROWS)
    cases = [Case(d, ff, op, rows) for d, ff in shapes for op in OPS for rows in rows_list]
    start = time.perf_counter()
    results = {"meta": {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                        "torch": torch.__version__, "dtype": str(dtype), "reps": args.reps, "iters": args.iters}}
    results["rows"] = [measure(case, dtype, device, args.reps, args.iters) for case in cases]
    print(f"kernel: {results['rows'][0]['kernel']}, {dtype}, {results['meta']['device']}")
    print(format_rows(results["rows"]), flush=True)
    if args.sweep:
        results["sweep"] = [sweep(case, dtype, device, max(1, args.reps // 2), max(1, args.iters // 2))
                            for case in cases]
        results["table"] = best_table(results["sweep"])
        print(format_table(results["table"]), flush=True)
    results["meta"]["seconds"] = time.perf_counter() - start
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))
    print(f"{results['meta']['seconds']:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
