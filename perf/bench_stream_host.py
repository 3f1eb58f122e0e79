"""A stream thread's GIL costs per request in the moss_tts stub, on the CPU (issue 34).

    PYTHONPATH=python_backends:. python3 perf/bench_stream_host.py [--step-ms 20] [--out x.json]

At the start of a 256-stream wave the H200's engine steps were host-bound (44 ms steps of 18 ms GPU
work, round 13): the engine thread waits to win the GIL back from ~256 stream threads starting
their requests and taking their first chunks. This measures three of a stream thread's costs that
the round-16 changes cut, with no Triton and no GPU:
- `tokenize`: what a prompt's tokenization leaves to the other threads. A counting thread runs
  beside `--reps` tokenizations of one text; its counts a second during them, against its counts a
  second alone, is the share of the calls' time in which another thread could run Python (0: the
  call held the GIL throughout). For the bench's 88-character text and a 400-character one, with
  the Rust binding's `encode` (before) and `encode_batch` (PromptBuilder now);
- `vocode_job`: making one VocodeJob, finishing it and reading its result, in µs;
- `cancel_checks`: how often a 112-frame stream asks the client about a cancel (an IPC round trip
  each) at `--step-ms` a step: SpeechStream over chunks of the served schedule (2, 4, 8, 16, 25,
  25, 25, 7 frames) that come as the engine would make them, with the served poll interval and
  with 0 (every chunk, the behaviour before).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from moss_tts.pipeline.speech_stream import CANCEL_POLL_S, SpeechStream
from moss_tts.pipeline.stream_ports import NO_CODES, CodesChunk, Ready
from moss_tts.vocoder.jobs import VocodeJob
from perf.bench_host_turn import SERVED_SWITCH_INTERVAL_S
from perf.bench_wave import TEXT as BENCH_TEXT, chunk_ends

LONG_TEXT = ("The quick brown fox jumps over the lazy dog while the weather report says rain. " * 5)[:400]
SCHEDULE = tuple(np.diff([0, *chunk_ends(112)]).tolist())  # 2, 4, 8, 16, 25, 25, 25, 7: the served chunks


def _counts_per_s(work, seconds: float) -> tuple[float, float]:
    """(another thread's counts a second while `work` runs in a loop, the loop's calls a second)."""
    stop, counts = threading.Event(), [0]

    def count():
        n = 0
        while not stop.is_set():
            n += 1
        counts[0] = n

    t = threading.Thread(target=count, daemon=True)
    t.start()
    time.sleep(0.01)
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        work()
        calls += 1
    elapsed = time.perf_counter() - started
    stop.set()
    t.join()
    return counts[0] / elapsed, calls / elapsed


def tokenize(tokenizer_json: Path, seconds: float) -> list[dict]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    alone, _ = _counts_per_s(lambda: time.sleep(0.001), seconds)  # the counter with the GIL to itself
    rows = []
    for name, text in (("bench text, 88 chars", BENCH_TEXT), ("400 chars", LONG_TEXT)):
        for call, work in (("encode", lambda: tok.encode(text, add_special_tokens=False)),
                           ("encode_batch", lambda: tok.encode_batch([text], add_special_tokens=False))):
            beside, rate = _counts_per_s(work, seconds)
            rows.append({"text": name, "call": call, "us_per_call": round(1e6 / rate, 1),
                         "share_left_to_other_threads": round(beside / alone, 3)})
    return rows


def vocode_job(reps: int) -> dict:
    codes, audio = np.zeros((4, 12), np.int64), [np.zeros((2, 4 * 3840), np.float32)]
    started = time.perf_counter()
    for _ in range(reps):
        job = VocodeJob("s", codes, False, False, lambda: None, 0.0)
        job._finish(audio, None)
        job.result()
    return {"us_per_job": round((time.perf_counter() - started) / reps * 1e6, 2)}


class _EngineLikeChildren:
    """The served chunk schedule, each chunk after as many steps as its frames; vocoding answered at once."""

    def __init__(self, step_s: float):
        self.step_s = step_s

    def stream_codes(self):
        for frames in SCHEDULE:
            time.sleep(frames * self.step_s)
            yield CodesChunk(np.zeros((frames, 12), np.int32), NO_CODES)

    def abort_codes(self):
        pass

    def vocode(self, codes, start, end, deadline=None):
        return Ready(np.zeros((2, codes.shape[0] * 3840), np.float32))


class _CountingClient:
    def __init__(self):
        self.checks = 0

    def send(self, audio, codes, context, final):
        pass

    def send_error(self, message, kind):
        raise AssertionError(message)

    def send_final(self):
        pass

    def is_cancelled(self):
        self.checks += 1
        return False


def cancel_checks(step_s: float) -> dict:
    out = {}
    for name, poll in (("every chunk (before)", 0.0), (f"at most every {CANCEL_POLL_S} s (served)", CANCEL_POLL_S)):
        client = _CountingClient()
        SpeechStream(_EngineLikeChildren(step_s), client, stream=True, cancel_poll_s=poll).run()
        out[name] = client.checks
    return {"chunks": len(SCHEDULE), "step_ms": step_s * 1e3, "checks_per_request": out}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # The tiny checkpoint's (make setup) here; a device call has only what its setup made (round 17's
    # call 1 ran this beside the setup, before any tokenizer existed there).
    p.add_argument("--tokenizer", type=Path, default=Path(os.environ.get("MOSS_TTS_MODEL_DIR", "checkpoints/tiny/model"))
                   / "tokenizer.json", help="tokenizer.json (default: $MOSS_TTS_MODEL_DIR's, else the tiny checkpoint's)")
    p.add_argument("--seconds", type=float, default=1.0, help="per tokenization measurement")
    p.add_argument("--reps", type=int, default=20000, help="VocodeJobs")
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--out")
    args = p.parse_args(argv)
    if not args.tokenizer.is_file():
        p.error(f"no tokenizer at {args.tokenizer}: make setup, or pass --tokenizer (a device call: after its setup)")
    sys.setswitchinterval(SERVED_SWITCH_INTERVAL_S)
    result = {"tokenize": tokenize(args.tokenizer, args.seconds), "vocode_job": vocode_job(args.reps),
              "cancel_checks": cancel_checks(args.step_ms / 1e3)}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args) | {"tokenizer": str(args.tokenizer)}, **result}, indent=1))
    return result


if __name__ == "__main__":
    main()
