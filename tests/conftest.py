"""Shared fixtures: one tiny random checkpoint (model + codec) per test session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python_backends"))
sys.path.insert(0, str(ROOT))  # the client package
sys.path.insert(0, str(ROOT / "tests"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped on CPU-only machines)")
    config.addinivalue_line("markers", "triton: starts or uses a real tritonserver (deselect with -m 'not triton')")


# The slowest files first (seconds on the 2-core machine, 2026-12-03), so that the two workers of
# `make test` (pytest-xdist, whole files per worker) do not end on one long file while the other
# worker idles; the rest keep their order.
SLOWEST_FILES = ("test_triton_pipeline", "test_openai_shim", "test_shutdown", "test_soak", "test_readme",
                 "test_vocoder_graphs", "test_stub_lifetime", "test_text_session_bls", "test_session_instances",
                 "test_window_attention", "test_failures", "test_openai_shim_workers", "test_generation",
                 "test_codec", "test_sample_kernel", "test_codec_cli", "test_engine", "test_decode_attention",
                 "test_engine_graphs", "test_generate_cli", "test_openai_shim_clients", "test_prefix_cache")


def pytest_collection_modifyitems(config, items):
    import torch

    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    from moss_tts.tools.make_tiny_checkpoint import main

    out = tmp_path_factory.mktemp("tiny")
    main([str(out), "--seed", "0"])
    return out


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from moss_tts.model.loading import load_model

    return load_model(tiny_dir / "model")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir):
    from moss_tts.model.loading import load_tokenizer

    return load_tokenizer(tiny_dir / "model")


@pytest.fixture(scope="session")
def builder(tiny_model, tiny_tokenizer):
    from moss_tts.model.processor import PromptBuilder

    return PromptBuilder(tiny_tokenizer, tiny_model.cfg)


@pytest.fixture(scope="session")
def triton(tiny_dir, tmp_path_factory):
    """The real tritonserver serving model_repository/ on the tiny checkpoint (CPU)."""
    from triton_server import start_server, stop_server

    server = start_server(tiny_dir / "model", tiny_dir / "codec", tmp_path_factory.mktemp("triton") / "server.log")
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def openai_shim(triton, tmp_path_factory):
    """`python -m client.openai_shim` on a free port in front of the `triton` fixture, with small
    limits so the limit tests stay cheap (a 3 s WebSocket idle timeout, 3 contexts per socket), and a
    reference directory of its own. Two worker processes, so every test that uses it runs against several (--workers)."""
    from shim_server import start_shim, stop_shim

    root = tmp_path_factory.mktemp("openai_shim")
    (root / "refs").mkdir()
    shim = start_shim(triton.grpc_url, root / "shim.log", root / "refs", "--max-body-bytes", "1000000",
                      "--max-reference-bytes", "200000", "--max-input-chars", "1000", "--metrics-url", triton.metrics_url,
                      "--ws-idle-timeout", "3", "--ws-max-buffered-chars", "2000", "--ws-max-contexts", "3",
                      workers=2)
    yield shim
    stop_shim(shim)


@pytest.fixture(scope="session")
def real_model():
    """Real-size MOSS-TTS architecture, seeded random weights, bf16 on CUDA (gpu tests only);
    built once per session because it takes seconds and ~9 GB."""
    import torch

    from moss_tts.model.config import MossTTSConfig, real_model_config_dict
    from moss_tts.model.loading import build_random_model

    cfg = MossTTSConfig.from_dict(real_model_config_dict(), "real")
    return build_random_model(cfg, "cuda", torch.bfloat16, seed=0)


@pytest.fixture(autouse=True)
def collected_before_a_gpu_test(request):
    """A GPU test starts with the earlier tests' dead reference cycles collected: an engine left in
    one (it holds its event callback, whose closure holds it) keeps its CUDA graphs, and a collection
    that frees them while this test captures invalidates the capture (round 17's H200 run of
    test_gpu_engine.py). The stubs and benchmarks capture through kernels/graph_capture.py; the
    kernel tests capture with torch.cuda.graph directly."""
    if "gpu" in request.node.keywords:
        import gc

        import torch

        if torch.cuda.is_available():
            gc.collect()
    yield


@pytest.fixture(autouse=True)
def no_stub_crashed():
    """After each test: no Python stub of a tritonserver that has exited crashed, whoever stopped
    it (triton_server.check_exited_servers; stop_server checks its own at once). Where the kernel
    log cannot be read, the run's warnings say so once per worker (crashes are then read from the
    server logs alone, through each stub's faulthandler)."""
    yield
    import warnings

    from triton_server import check_exited_servers, kernel_log_problem

    check_exited_servers()
    if kernel_log_problem and not _kernel_log_noted:
        _kernel_log_noted.append(True)
        warnings.warn(f"the kernel log could not be read ({kernel_log_problem[0]}): stub crashes were read from the "
                      "server logs alone (faulthandler)")


_kernel_log_noted: list = []
