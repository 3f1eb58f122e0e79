"""Speak text through a moss-tts-triton server over gRPC streaming and write a WAV.

  python -m client.speak "Hello world" -o out.wav [--reference ref.wav --reference-text "..."]
         [--stream] [--seed 1] [--url localhost:8001]
  some_llm | python -m client.speak --text-stdin -o out.wav   # text spoken as it arrives

Prints the time to first audio, the total time and the real-time factor.
"""

from __future__ import annotations

import argparse
import codecs
import os
import sys
import threading
import time
from pathlib import Path

import soundfile as sf

from moss_tts.contract.text_segments import split_text

from . import model_stats
from .tts_client import SAMPLE_RATE, InferenceServerException, TTSClient, build_inputs
from .voices import VoiceStore


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m client.speak", description=__doc__.split("\n\n")[0])
    p.add_argument("text", nargs="?", help="the text to speak (or --text-stdin)")
    p.add_argument("--text-stdin", action="store_true",
                   help="read the text from stdin as it arrives and speak it in one text session (one voice, "
                        "one audio stream); each sentence is spoken as soon as it is complete")
    p.add_argument("-o", "--output", type=Path, required=True, help="output .wav (48 kHz stereo)")
    p.add_argument("--url", default="localhost:8001", help="tritonserver gRPC address")
    p.add_argument("--reference", type=Path, help="reference audio to clone (wav/flac/ogg, <= 100 s)")
    p.add_argument("--reference-text", help="transcript of the reference (continuation mode)")
    p.add_argument("--voice", help="a saved voice (name or id) from --voices-dir, instead of --reference")
    p.add_argument("--voices-dir", type=Path, help="the saved voices directory (the shim's --voices-dir)")
    p.add_argument("--mode", choices=["clone", "continuation"])
    p.add_argument("--language")
    p.add_argument("--instructions")
    p.add_argument("--tokens", type=int, help="target duration in frames (12.5 per second)")
    p.add_argument("--stream", action="store_true", help="receive audio chunk by chunk as it is decoded")
    p.add_argument("--seed", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--max-frames", type=int)
    p.add_argument("--progress", action="store_true", help="show the progress line even when stderr is not a terminal")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--stats", action="store_true",
                   help="print what each Triton model did for this request (requests, batches, queue/compute ms)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if (args.text is None) == (not args.text_stdin):
        print("error: give the text as an argument or --text-stdin, not both", file=sys.stderr)
        return 2
    reference, codes, reference_text = None, None, args.reference_text
    if args.voice is not None:
        if args.reference is not None or args.voices_dir is None:
            print("error: --voice needs --voices-dir and no --reference", file=sys.stderr)
            return 2
        store = VoiceStore(args.voices_dir)
        voice = store.get(args.voice)
        if voice is None:
            print(f"error: no saved voice {args.voice!r} in {args.voices_dir}", file=sys.stderr)
            return 2
        codes, reference_text = store.codes(voice), reference_text or voice.transcript
    if args.reference is not None:
        if not args.reference.is_file():
            print(f"error: {args.reference}: file not found", file=sys.stderr)
            return 2
        reference = args.reference.read_bytes()
    if args.text_stdin:
        return speak_stdin(args, reference, codes, reference_text)
    inputs = build_inputs(args.text, reference, reference_codes=codes, reference_text=reference_text, mode=args.mode,
                          language=args.language, instructions=args.instructions, tokens=args.tokens,
                          stream=args.stream, seed=args.seed, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, repetition_penalty=args.repetition_penalty, max_frames=args.max_frames)
    before = model_stats.snapshot(args.url) if args.stats else None
    progress = Progress(len(split_text(args.text)), enabled=not args.quiet and sys.stderr.isatty() or args.progress)
    start = time.perf_counter()
    first, chunks, samples = None, 0, 0
    try:
        # The file grows as chunks arrive: a long text is on disk (and playable) while it is spoken.
        with sf.SoundFile(str(args.output), "w", SAMPLE_RATE, 2, subtype="FLOAT") as out:
            for chunk in TTSClient(args.url).stream(inputs):
                first = time.perf_counter() - start if first is None else first
                out.write(chunk.T)
                chunks, samples = chunks + 1, samples + chunk.shape[1]
                progress.update(samples / SAMPLE_RATE, time.perf_counter() - start)
    except InferenceServerException as exc:
        progress.done()
        print(f"error: {exc.status() or 'server'}: {exc.message()}", file=sys.stderr)
        return 1
    progress.done()
    total = time.perf_counter() - start
    seconds = samples / SAMPLE_RATE
    rtf = total / seconds if seconds else float("nan")
    print(f"wrote {args.output}: {seconds:.2f} s of 48 kHz stereo audio in {chunks} chunk(s)")
    print(f"time to first audio: {first * 1000:.0f} ms" if first is not None else "time to first audio: n/a")
    print(f"total time: {total * 1000:.0f} ms, real-time factor: {rtf:.3f}")
    if before is not None:
        print(model_stats.table(model_stats.deltas(before, model_stats.snapshot(args.url))))
    return 0


def speak_stdin(args, reference, codes, reference_text) -> int:
    """Text from stdin, read as it arrives (a thread), into one text session; audio to the WAV."""
    options = dict(reference_audio=reference, reference_codes=codes, reference_text=reference_text, mode=args.mode,
                   language=args.language, instructions=args.instructions, seed=args.seed,
                   temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                   repetition_penalty=args.repetition_penalty, max_frames=args.max_frames)
    session = TTSClient(args.url).text_session(**{k: v for k, v in options.items() if v is not None})
    reader = threading.Thread(target=_read_stdin, args=(session,), daemon=True)
    start = time.perf_counter()
    first, samples = None, 0
    reader.start()
    try:
        with sf.SoundFile(str(args.output), "w", SAMPLE_RATE, 2, subtype="FLOAT") as out:
            for chunk in session.chunks():
                first = time.perf_counter() - start if first is None else first
                out.write(chunk.audio.T)
                samples += chunk.audio.shape[1]
                if chunk.is_final and not args.quiet:
                    print(f"segment {chunk.segment + 1} spoken ({samples / SAMPLE_RATE:.1f} s of audio, "
                          f"{time.perf_counter() - start:.1f} s): {session.segments[chunk.segment][:60]!r}",
                          file=sys.stderr, flush=True)
    except InferenceServerException as exc:
        print(f"error: {exc.status() or 'server'}: {exc.message()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        session.cancel()
        return 130
    seconds = samples / SAMPLE_RATE
    print(f"wrote {args.output}: {seconds:.2f} s of 48 kHz stereo audio in {len(session.segments)} segment(s)")
    print(f"time to first audio: {first * 1000:.0f} ms" if first is not None else "time to first audio: n/a")
    return 0


def _read_stdin(session) -> None:
    """Each piece of stdin as it arrives (not line by line: an LLM writes words), then end()."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        while piece := os.read(sys.stdin.fileno(), 4096):
            session.send_text(decoder.decode(piece))
        session.send_text(decoder.decode(b"", final=True))
        session.end()
    except Exception as exc:  # the session failed (chunks() raises it) or was cancelled
        print(f"stdin reader stopped: {exc}", file=sys.stderr)


class Progress:
    """One status line on stderr, rewritten per chunk: audio so far, elapsed time, and (for a long
    text) the segments the server will speak."""

    def __init__(self, segments: int, enabled: bool) -> None:
        self.segments = segments
        self.enabled = enabled
        self._shown = False

    def update(self, audio_s: float, elapsed_s: float) -> None:
        if not self.enabled:
            return
        parts = f" of a {self.segments}-segment text" if self.segments > 1 else ""
        sys.stderr.write(f"\r{audio_s:7.1f} s of audio{parts} received in {elapsed_s:6.1f} s")
        sys.stderr.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown:
            sys.stderr.write("\n")
            self._shown = False


if __name__ == "__main__":
    sys.exit(main())
