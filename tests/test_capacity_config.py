"""Capacity is configuration, and the pieces of it must agree (read from the shipped files)."""

from __future__ import annotations

import re

from conftest import ROOT

REPO = ROOT / "model_repository"


def parameter(model: str, key: str) -> int:
    text = (REPO / model / "config.pbtxt").read_text()
    match = re.search(rf'key: "{key}" value: {{ string_value: "(\d+)" }}', text)
    assert match, f"{model}/config.pbtxt has no integer parameter {key}"
    return int(match.group(1))


def field(model: str, name: str) -> int:
    match = re.search(rf"^{name}: (\d+)", (REPO / model / "config.pbtxt").read_text(), re.M)
    assert match, f"{model}/config.pbtxt has no {name}"
    return int(match.group(1))


def thread_pool_sizes() -> list[int]:
    found = []
    for path in (ROOT / "scripts" / "serve.sh", ROOT / "Dockerfile"):
        sizes = re.findall(r"thread-pool-size=(\d+)", path.read_text())
        assert sizes, f"{path.name} does not set the python backend's thread-pool-size"
        found += [int(s) for s in sizes]
    return found


def test_streams_cover_the_engine_and_fit_its_queue():
    rows, queue, streams = (parameter("moss_tts", k) for k in ("max_running_requests", "max_queue", "max_streams"))
    assert rows >= 256, "the H200 target is 256 concurrent streams"
    assert rows <= streams <= rows + queue, "a stream beyond the engine's rows must find a place in its queue"


def string_parameter(text: str, key: str) -> str:
    match = re.search(rf'key: "{key}" value: {{ string_value: "([^"]*)" }}', text)
    assert match, f"no parameter {key}"
    return match.group(1)


def test_the_pipelines_vocoder_has_a_slot_for_every_engine_row():
    # moss_tts decodes in process: every running request can hold a codec sequence.
    text = (REPO / "moss_tts" / "config.pbtxt").read_text()
    assert string_parameter(text, "vocoder") == "in_process"
    slots = parameter("moss_tts", "vocoder_slots") or parameter("moss_tts", "max_streams")
    assert slots >= parameter("moss_tts", "max_running_requests")


def test_the_vocoder_model_serves_direct_callers_and_the_split_layout():
    slots, public = parameter("vocoder", "max_slots"), parameter("vocoder", "max_public_sessions")
    assert public <= slots <= field("vocoder", "max_batch_size")
    # Split: moss_tts on one GPU calls the vocoder model on the other for every stream.
    split = (REPO / "vocoder" / "configs" / "split_2gpu.pbtxt").read_text()
    assert string_parameter((REPO / "moss_tts" / "configs" / "split_2gpu.pbtxt").read_text(), "vocoder") == "bls"
    assert int(string_parameter(split, "max_slots")) >= parameter("moss_tts", "max_running_requests") + public


def test_every_stream_can_hold_a_python_backend_thread():
    # Each stream blocks one parent-side thread of its instance during a BLS call or a send.
    assert all(size > parameter("moss_tts", "max_streams") for size in thread_pool_sizes())


def test_vocoder_idle_timeout_is_deliberate():
    text = (REPO / "vocoder" / "config.pbtxt").read_text()
    idle_us = int(re.search(r"max_sequence_idle_microseconds: (\d+)", text).group(1))
    assert 5_000_000 <= idle_us <= 60_000_000  # not Triton's 1 s default, not long enough to hoard slots


def test_ref_encoder_queue_holds_every_stream():
    text = (REPO / "ref_encoder" / "config.pbtxt").read_text()
    queue = int(re.search(r"max_queue_size: (\d+)", text).group(1))
    assert queue >= parameter("moss_tts", "max_streams")  # a soak at 256 streams overflowed a queue of 64


def test_the_h200_memory_plan_fits():
    # The engine sizes nothing itself: a parameter lost from config.pbtxt falls back to the
    # EngineConfig default and the real-size engine refused to load on the H200 (2026-12-01).
    # Figures of that load: 139.8 GiB to torch, this process holds 36.5 GiB before its KV cache
    # (engine weights, the in-process codec's weights, 288-slot state and graph pool), the KV
    # cache with its prefix pool needs 73.1 GiB, 4 GiB activation reserve.
    text = (REPO / "moss_tts" / "config.pbtxt").read_text()
    utilization = float(string_parameter(text, "gpu_memory_utilization"))
    budget = utilization * 139.8 - parameter("moss_tts", "reserved_memory_gib") - 36.5 - 4.0
    assert budget >= 73.1, f"the KV cache (73.1 GiB) would not fit the {budget:.1f} GiB budget"
    assert parameter("moss_tts", "reserved_memory_gib") >= 8  # the vocoder model and ref_encoder beside it


def test_the_gil_switch_interval_is_read_and_checked():
    import pytest
    from moss_tts.contract.parameters import switch_interval_s

    text = (REPO / "moss_tts" / "config.pbtxt").read_text()
    shipped = float(re.search(r'key: "gil_switch_interval_ms" value: { string_value: "([0-9.]+)" }', text).group(1))
    assert switch_interval_s({"gil_switch_interval_ms": str(shipped)}) == pytest.approx(shipped / 1000)
    assert switch_interval_s({}) == pytest.approx(shipped / 1000)  # the default is the shipped value
    assert switch_interval_s({"gil_switch_interval_ms": "0.2"}) == pytest.approx(0.0002)
    for bad in ("0", "-1", "500", "fast"):
        with pytest.raises(ValueError, match="gil_switch_interval_ms"):
            switch_interval_s({"gil_switch_interval_ms": bad})
