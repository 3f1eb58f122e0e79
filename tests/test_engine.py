"""Continuous-batching engine: equal to the reference loop whatever the admission timing,
chunking, cancellation, admission errors and failure isolation. CPU, tiny checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moss_tts.contract.sampling_params import ChannelParams, SamplingParams
from moss_tts.engine import (Engine, EngineClosed, EngineConfig, EngineConfigError, EngineRequest, Finished, QueueFull,
                             chunk_target)
from moss_tts.engine.request import RequestState
from moss_tts.engine.scheduler import Scheduler
from moss_tts.model.generation import generate
from moss_tts.model.processor import PromptFields, PromptSpec

from engine_events import TIMEOUT_S, Collector, assert_matches_reference

def assert_idle(engine: Engine, max_running: int) -> None:
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.free_slots) == (0, 0, max_running), stats


def test_chunks_grow_from_the_first_to_chunk_frames():
    sizes, sent = [], 0
    while len(sizes) < 6:
        sizes.append(chunk_target(sent, 2, 10))
        sent += sizes[-1]
    assert sizes == [2, 4, 8, 10, 10, 10]
    assert [chunk_target(n, 10, 10) for n in (0, 10, 20)] == [10, 10, 10]  # first >= chunk_frames: steady
    assert chunk_target(20, 20, 10) == 10


def test_doubling_chunks_are_as_large_as_the_audio_already_sent():
    sizes, sent = [], 0
    while len(sizes) < 7:
        sizes.append(chunk_target(sent, 2, 10, doubling=True))
        sent += sizes[-1]
    assert sizes == [2, 2, 4, 8, 10, 10, 10]
    assert [chunk_target(n, 3, 10, doubling=True) for n in (0, 3, 6, 12)] == [3, 3, 6, 10]
    assert [chunk_target(n, 10, 10, doubling=True) for n in (0, 10, 20)] == [10, 10, 10]


def expected_chunk_sizes(num_frames: int, first: int, every: int, doubling: bool = False) -> list[int]:
    sizes = []
    while sum(sizes) < num_frames:
        sizes.append(min(chunk_target(sum(sizes), first, every, doubling), num_frames - sum(sizes)))
    return sizes


@pytest.fixture(scope="module")
def prompts(builder):
    ref = torch.randint(0, 1024, (6, 12), generator=torch.Generator().manual_seed(3))
    specs = [
        PromptSpec("Hello there."),
        PromptSpec("A much longer sentence to speak, with a pause [pause 0.5s] inside.",
                   PromptFields(language="English", tokens=40)),
        PromptSpec("Clone this voice.", reference_codes=ref),
        PromptSpec("and then it goes on", reference_codes=ref, reference_text="It starts ", mode="continuation"),
        PromptSpec("Good morning, everyone."),
        PromptSpec("Numbers: one, two, three.", PromptFields(instruction="calm")),
        PromptSpec("Clone again, slower.", reference_codes=ref[:4]),
        PromptSpec("Bye."),
    ]
    return [builder.build(s) for s in specs]


def make_engine(model, sink, **config) -> Engine:
    return Engine(model, EngineConfig(**config), sink)


def test_engine_matches_reference_with_staggered_admission(tiny_model, prompts):
    sampled = dict(ignore_stop=True)
    params = [
        SamplingParams(seed=100, max_frames=12, **sampled),
        SamplingParams(seed=101, max_frames=16, **sampled),
        SamplingParams(seed=102, max_frames=6, **sampled),
        SamplingParams.greedy(max_frames=12),  # the greedy stop head of this checkpoint stops early
        SamplingParams(seed=104, max_frames=14, audio=ChannelParams(1.0, 0.95, 50, 1.3), **sampled),
        SamplingParams(seed=105, max_frames=9, **sampled),
        SamplingParams(seed=106, max_frames=14),  # sampled stop head, may stop on its own
        SamplingParams(seed=107, max_frames=10, **sampled),
    ]
    reference = generate(tiny_model, prompts, params)
    assert reference[3].finish_reason == "stop"
    ids = [f"req-{i}" for i in range(8)]
    sink = Collector()
    engine = make_engine(tiny_model, sink, max_running_requests=4, first_chunk_frames=2, chunk_frames=5)
    engine.start()
    try:
        for i in range(3):
            engine.submit(EngineRequest(ids[i], prompts[i], params[i]))
        assert sink.first_chunk[ids[0]].wait(TIMEOUT_S)
        for i in range(3, 8):  # these join batches already in flight, 4 of them wait for a slot
            engine.submit(EngineRequest(ids[i], prompts[i], params[i]))
        sink.wait_finished(ids)
    finally:
        engine.shutdown(TIMEOUT_S)
    for rid, ref in zip(ids, reference):
        assert_matches_reference(sink, rid, ref)
    stats = engine.stats()
    assert 1 < stats.max_batch_size_seen <= 4, stats
    assert stats.requests_admitted == stats.requests_finished == 8
    assert stats.frames_generated == sum(r.codes.shape[0] for r in reference)
    assert stats.step_host_ms > 0 and stats.step_wait_ms >= 0  # the engine thread's time split
    # two parts of the host time (each rounded to a millisecond on its own)
    assert stats.step_launch_ms > 0 and stats.step_launch_ms + stats.step_apply_ms <= stats.step_host_ms + 2, stats
    assert_idle(engine, 4)


@pytest.mark.parametrize("chunk_tokens", [4096, 200])
def test_one_step_admits_prompts_of_every_length_and_each_gets_its_own_frames(tiny_model, prompts, chunk_tokens):
    """All eight prompts (rows 28..94, in no length order) are waiting when the engine starts:
    the first step admits them together and the runner prefills them longest first, in one
    launch (4096) or several bounded ones (200); each request still gets its own frames."""
    params = [SamplingParams(seed=200 + i, max_frames=5 + i, ignore_stop=True) for i in range(8)]
    reference = generate(tiny_model, prompts, params)
    ids = [f"all-{i}" for i in range(8)]
    sink = Collector()
    engine = make_engine(tiny_model, sink, max_running_requests=8, prefill_chunk_tokens=chunk_tokens)
    for rid, prompt, p in zip(ids, prompts, params):
        engine.submit(EngineRequest(rid, prompt, p))
    engine.start()
    try:
        sink.wait_finished(ids)
    finally:
        engine.shutdown(TIMEOUT_S)
    for rid, ref in zip(ids, reference):
        assert_matches_reference(sink, rid, ref)
    assert engine.stats().max_batch_size_seen == 8
    assert_idle(engine, 8)


def test_prefill_plan_pads_few_rows_in_few_bounded_launches():
    from moss_tts.engine.prefill_batch import StagedPrompt, prefill_plan as _prefill_plan

    def staged(slot, rows):
        return StagedPrompt(slot, torch.zeros(rows, 13, dtype=torch.long), SamplingParams(seed=0))

    prompts = [staged(0, 14), staged(1, 300), staged(2, 16), staged(3, 5000), staged(4, 14), staged(5, 90)]
    order, groups = _prefill_plan(prompts, 1024)
    # Grouped longest first (5000 alone: past the budget; 300 + 90 + 16: 3 x 300 <= 1024), then
    # run shortest group first: a batched-prefill graph writes its rows from row 0.
    assert [(first, [p.slot for p in g]) for first, g in groups] == [(0, [0, 4]), (2, [1, 5, 2]), (5, [3])]
    assert [p.slot for p in order] == [0, 4, 1, 5, 2, 3]
    for _, group in groups[:-1]:  # padded to its longest, each launch stays within the budget
        assert len(group) * max(p.rows.shape[0] for p in group) <= 1024
    many = [staged(i, 14) for i in range(200)]
    assert len(_prefill_plan(many, 4096)[1]) == 1  # a wave of short prompts: one launch


def test_chunk_sizes_follow_config_and_per_request_override(tiny_model, prompts):
    sink = Collector()
    engine = make_engine(tiny_model, sink, max_running_requests=4, first_chunk_frames=2, chunk_frames=5)
    frames = [23, 23, 10, 1]
    overrides = [{}, dict(first_chunk_frames=1, chunk_frames=7), dict(chunk_frames=3), {}]
    ids = [f"chunk-{i}" for i in range(4)]
    for i, rid in enumerate(ids):  # queued before start: the first step admits all four together
        engine.submit(EngineRequest(rid, prompts[i], SamplingParams(seed=i, max_frames=frames[i],
                                                                    ignore_stop=True), **overrides[i]))
    engine.start()
    try:
        sink.wait_finished(ids)
    finally:
        engine.shutdown(TIMEOUT_S)
    sizes = {rid: [c.num_frames for c in sink.chunks(rid)] for rid in ids}
    assert sizes == {
        ids[0]: expected_chunk_sizes(23, 2, 5),  # [2, 4, 5, 5, 5, 2]
        ids[1]: expected_chunk_sizes(23, 1, 7),  # [1, 2, 4, 7, 7, 2]
        ids[2]: expected_chunk_sizes(10, 2, 3),  # [2, 3, 3, 2]
        ids[3]: [1],
    }
    # Chunks grow by what was already sent (never past the audio already sent + the first chunk).
    assert sizes[ids[0]] == [2, 4, 5, 5, 5, 2] and sizes[ids[1]] == [1, 2, 4, 7, 7, 2]
    codes = sink.chunks(ids[0])[0].codes
    # numpy (no torch call on the engine thread), owned by the consumer, which may change it
    assert isinstance(codes, np.ndarray) and codes.dtype == np.int32 and codes.shape[1] == 12
    assert codes.flags.writeable and codes.flags.owndata
    assert all(sink.final(rid).reason == "max_frames" for rid in ids)
    assert engine.stats().max_batch_size_seen == 4
    assert_idle(engine, 4)


def test_chunk_doubling_from_the_config_keeps_the_frames(tiny_model, prompts):
    """chunk_doubling: 2, 2, 4, 8, 5 for a 21-frame request (the last is what is left), and the
    codes are the plain engine's, chunked differently."""
    chunks = {}
    for doubling in (False, True):
        sink = Collector()
        engine = make_engine(tiny_model, sink, max_running_requests=2, chunk_doubling=doubling)
        engine.submit(EngineRequest("d", prompts[0], SamplingParams(seed=5, max_frames=21, ignore_stop=True)))
        engine.start()
        try:
            sink.wait_finished(["d"])
        finally:
            engine.shutdown(TIMEOUT_S)
        chunks[doubling] = sink.chunks("d")
    assert [c.num_frames for c in chunks[True]] == expected_chunk_sizes(21, 2, 10, True) == [2, 2, 4, 8, 5]
    assert [c.num_frames for c in chunks[False]] == [2, 4, 8, 7]
    assert np.array_equal(np.concatenate([c.codes for c in chunks[True]]),
                          np.concatenate([c.codes for c in chunks[False]]))


def test_abort_frees_the_slot_and_leaves_others_untouched(tiny_model, prompts):
    params = {"a": SamplingParams(seed=7, max_frames=12, ignore_stop=True),
              "b": SamplingParams(seed=8, max_frames=15, ignore_stop=True)}
    reference = dict(zip(params, generate(tiny_model, prompts[1:3], list(params.values()))))
    at_cancel = {}

    def abort_long(event):  # from the engine thread: the abort lands at a known frame
        if event.request_id == "long":
            engine.abort("long")

    def on_event(event):
        if isinstance(event, Finished) and event.request_id == "long":
            at_cancel["stats"] = engine.stats()
        sink(event)

    sink = Collector(on_first_chunk=abort_long)
    engine = make_engine(tiny_model, on_event, max_running_requests=3, first_chunk_frames=2)
    engine.submit(EngineRequest("long", prompts[0], SamplingParams(seed=1, max_frames=400, ignore_stop=True)))
    engine.submit(EngineRequest("a", prompts[1], params["a"]))
    engine.submit(EngineRequest("b", prompts[2], params["b"]))
    engine.submit(EngineRequest("queued", prompts[3], SamplingParams(seed=2, max_frames=5)))
    assert engine.abort("queued") and not engine.abort("queued") and not engine.abort("unknown")
    engine.start()
    try:
        sink.wait_finished(["long", "a", "b", "queued"])
    finally:
        engine.shutdown(TIMEOUT_S)
    long_final = sink.final("long")
    assert (long_final.reason, long_final.num_frames) == ("cancelled", 2)
    assert [c.num_frames for c in sink.chunks("long")] == [2]
    # Freed before Finished was sent; a and b were still running then.
    assert (at_cancel["stats"].free_slots, at_cancel["stats"].running) == (1, 2)
    queued = sink.final("queued")
    assert (queued.reason, queued.num_frames, sink.chunks("queued")) == ("cancelled", 0, [])
    for rid in ("a", "b"):
        assert_matches_reference(sink, rid, reference[rid])
    assert engine.stats().requests_cancelled == 2
    assert not engine.abort("long")
    assert_idle(engine, 3)


def test_queue_full_and_bad_requests(tiny_model, prompts):
    sink = Collector()
    engine = make_engine(tiny_model, sink, max_queue=2, max_seq_len=128)
    ok = SamplingParams(seed=0, max_frames=10)
    engine.submit(EngineRequest("q0", prompts[0], ok))
    with pytest.raises(ValueError, match="already queued"):
        engine.submit(EngineRequest("q0", prompts[0], ok))
    engine.submit(EngineRequest("q1", prompts[0], ok))
    with pytest.raises(QueueFull, match="max_queue"):
        engine.submit(EngineRequest("q2", prompts[0], ok))
    with pytest.raises(ValueError, match="max_seq_len"):  # 94 prompt rows + 40 frames > 128
        engine.submit(EngineRequest("long", prompts[1], SamplingParams(seed=0, max_frames=40)))
    with pytest.raises(ValueError, match="13 columns"):
        engine.submit(EngineRequest("narrow", prompts[0][:, :12], ok))
    bad_ids = prompts[0].clone()
    bad_ids[0, 5] = 2000
    with pytest.raises(ValueError, match="codes must lie"):
        engine.submit(EngineRequest("codes", bad_ids, ok))
    with pytest.raises(ValueError, match="int64"):
        EngineRequest("float", prompts[0].float(), ok)
    with pytest.raises(ValueError, match="chunk_frames"):
        EngineRequest("chunk", prompts[0], ok, chunk_frames=0)
    with pytest.raises(ValueError, match="request_id"):
        EngineRequest("", prompts[0], ok)
    engine.shutdown()  # never started: the queued requests still get their one final event
    assert [sink.final(r).reason for r in ("q0", "q1")] == ["cancelled", "cancelled"]
    with pytest.raises(EngineClosed):
        engine.submit(EngineRequest("late", prompts[0], ok))


@pytest.mark.parametrize("field, value", [("max_running_requests", 0), ("max_queue", -1),
                                          ("chunk_frames", 0), ("first_chunk_frames", 1.5),
                                          ("prefill_chunk_tokens", 0), ("dtype", "int8"),
                                          ("kv_cache_dtype", "int4"), ("kv_cache_dtype", "fp8")])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(EngineConfigError, match=field):
        EngineConfig(**{field: value})


def test_config_must_match_the_model(tiny_model):
    with pytest.raises(EngineConfigError, match="dtype"):
        Engine(tiny_model, EngineConfig(dtype="bfloat16"), lambda e: None)
    with pytest.raises(EngineConfigError, match="max_seq_len"):
        Engine(tiny_model, EngineConfig(max_seq_len=10**6), lambda e: None)


def test_step_failure_ends_running_requests_and_engine_keeps_serving(tiny_model, prompts, monkeypatch):
    sink = Collector()
    engine = make_engine(tiny_model, sink, max_running_requests=4)
    runner = engine._runner
    real_run_step, real_stage_prompt = runner.run_step, runner.stage_prompt
    calls = {"run_step": 0}

    def flaky_run_step(plan):
        calls["run_step"] += 1
        if calls["run_step"] == 1:
            raise RuntimeError("injected decode failure")
        return real_run_step(plan)

    def flaky_stage_prompt(slot, rows, params, prefix, *rest):
        if params.seed == 666:
            raise RuntimeError("injected prefill failure")
        real_stage_prompt(slot, rows, params, prefix, *rest)

    monkeypatch.setattr(runner, "run_step", flaky_run_step)
    monkeypatch.setattr(runner, "stage_prompt", flaky_stage_prompt)
    params = SamplingParams(seed=5, max_frames=8, ignore_stop=True)
    reference = generate(tiny_model, [prompts[4]], [params])[0]
    for rid in ("f0", "f1"):
        engine.submit(EngineRequest(rid, prompts[0], SamplingParams(seed=1, max_frames=30, ignore_stop=True)))
    engine.start()
    try:
        sink.wait_finished(["f0", "f1"])
        for rid in ("f0", "f1"):
            final = sink.final(rid)
            assert final.reason == "error" and "injected decode failure" in final.error, final
        assert_idle(engine, 4)
        engine.submit(EngineRequest("bad-prefill", prompts[1], SamplingParams(seed=666, max_frames=8)))
        engine.submit(EngineRequest("after", prompts[4], params))
        sink.wait_finished(["bad-prefill", "after"])
    finally:
        engine.shutdown(TIMEOUT_S)
    final = sink.final("bad-prefill")
    assert final.reason == "error" and "injected prefill failure" in final.error
    assert_matches_reference(sink, "after", reference)
    assert engine.stats().requests_failed == 3
    assert_idle(engine, 4)


def test_scheduler_admits_fifo_within_slots_and_prefill_budget(prompts):
    config = EngineConfig(max_running_requests=2, prefill_chunk_tokens=100)
    scheduler = Scheduler(config)
    states = [RequestState.create(EngineRequest(f"s{i}", prompts[i], SamplingParams(seed=i)), config)
              for i in range(4)]  # prompt rows 64, 94, 72, 82
    for state in states:
        scheduler.add(state)
    admitted = lambda plan: [s.request_id for s in plan.admitted]  # noqa: E731
    assert admitted(scheduler.schedule()) == ["s0"]  # 64 + 94 > 100: s1 waits for the next step
    assert admitted(scheduler.schedule()) == ["s1"]  # the head always fits on its own
    assert admitted(scheduler.schedule()) == []  # both slots taken
    scheduler.retire(states[0])
    scheduler.abort("s2")
    plan = scheduler.schedule()
    assert [s.request_id for s in plan.cancelled] == ["s2"] and admitted(plan) == ["s3"]
    assert [s.request_id for s in plan.running] == ["s1", "s3"]
    assert not scheduler.abort("s2") and scheduler.num_waiting == 0


def test_the_prefill_budget_counts_rows_not_copied_from_the_prefix_pool(prompts):
    """A prompt whose prefix the pool holds costs only its remaining rows: with a 100-row
    budget, four 94-row prompts that share 80 rows are one step's admission, not four steps'."""
    config = EngineConfig(max_running_requests=8, prefill_chunk_tokens=100, prefix_cache_rows=1024)
    scheduler = Scheduler(config)
    prompt = prompts[1]  # 94 rows
    first = RequestState.create(EngineRequest("p0", prompt, SamplingParams(seed=0)), config)
    scheduler.add(first)
    plan = scheduler.schedule()
    assert [s.request_id for s in plan.admitted] == ["p0"]
    scheduler.cache.plan_step([(first.slot, first.prefix)], [])  # its blocks go to the pool
    for i in range(1, 5):
        scheduler.add(RequestState.create(EngineRequest(f"p{i}", prompt, SamplingParams(seed=i)), config))
    plan = scheduler.schedule()
    reused = prompt.shape[0] - 1 - (prompt.shape[0] - 1) % 16  # whole blocks, the last row left
    assert [s.request_id for s in plan.admitted] == ["p1", "p2", "p3", "p4"][:100 // (prompt.shape[0] - reused)]
    assert all(s.prefix.reused_rows == reused for s in plan.admitted)


def test_the_step_histograms_count_every_step():
    from moss_tts.contract.metrics import Histogram

    h = Histogram((1, 2, 4))
    for v in (0.5, 1, 3, 9):
        h.observe(v)
    assert h.cumulative() == ([2, 2, 3, 4], 13.5, 4)  # le=1: 0.5 and 1; le=+Inf: all four
