"""The OpenAI speech API (POST /v1/audio/speech, WS /v1/audio/speech/stream, GET /v1/models, GET /health)
in front of a running tritonserver; `make serve` starts it next to tritonserver (scripts/serve.sh).

  python -m client.openai_shim [--port 8080] [--triton-url localhost:8001] [--workers N] [...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import DEFAULT_MODEL_NAMES, OPENAI_MODEL_NAMES, ConfigError, ShimConfig
from .triton_stream import RESOLVER_SCHEMES
from .workers import MAX_DEFAULT_WORKERS, default_workers, serve


def parse_args(argv) -> argparse.Namespace:
    defaults = ShimConfig()
    p = argparse.ArgumentParser(prog="python -m client.openai_shim", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default=defaults.host)
    p.add_argument("--port", type=int, default=defaults.port)
    p.add_argument("--workers", type=int, default=None,
                   help=f"worker processes on the one port (default: one per usable core, a CPU limit counted, "
                        f"at most {MAX_DEFAULT_WORKERS}; 1 = a single process)")
    p.add_argument("--triton-url", default=defaults.triton_url,
                   help="tritonserver gRPC address; dns:///NAME:PORT balances streams over every address of NAME "
                        "(e.g. a Kubernetes headless Service), one pick per stream")
    p.add_argument("--triton-model", default=defaults.triton_model)
    p.add_argument("--served-model-name", action="append", dest="model_names",
                   help=f"a model id clients may send (repeatable; default: {', '.join(DEFAULT_MODEL_NAMES)})")
    p.add_argument("--model-alias", action="append", dest="model_aliases", default=[],
                   help=f"one more id for the model, listed by /v1/models (repeatable; OpenAI's "
                        f"{', '.join(OPENAI_MODEL_NAMES)} are aliases already)")
    p.add_argument("--no-openai-model-names", action="store_true",
                   help=f"do not serve OpenAI's model names ({', '.join(OPENAI_MODEL_NAMES)}) as aliases")
    p.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
    p.add_argument("--max-input-chars", type=int, default=defaults.max_input_chars)
    p.add_argument("--max-reference-bytes", type=int, default=defaults.max_reference_bytes)
    p.add_argument("--reference-dir", type=Path, help="allow `audio_path` references to files inside this directory")
    p.add_argument("--voices-dir", type=Path,
                   help="saved voices (POST/GET/DELETE /v1/audio/voices) live here; shared by several shims and "
                        "by `client.speak --voices-dir`; without it the voices API answers 404")
    p.add_argument("--allow-url-references", action="store_true", help="allow http(s) URL references")
    p.add_argument("--allow-private-url-hosts", action="store_true",
                   help="let URL references reach loopback/private/link-local addresses (off: SSRF guard)")
    p.add_argument("--url-timeout", type=float, default=defaults.url_timeout_s, help="seconds per URL download")
    p.add_argument("--response-timeout", type=float, default=defaults.response_timeout_s,
                   help="seconds to wait for the next Triton response before answering 504")
    p.add_argument("--metrics-url", default=None,
                   help="tritonserver metrics, where model heartbeats are read (default: port 8002 on the host "
                        "of --triton-url; '' turns the check off)")
    p.add_argument("--heartbeat-stale", type=float, default=defaults.heartbeat_stale_s,
                   help="seconds without a model heartbeat before /health and every request answer 503")
    p.add_argument("--ws-idle-timeout", type=float, default=defaults.ws_idle_timeout_s,
                   help="seconds a WebSocket may stay without a client message before it is closed")
    p.add_argument("--ws-max-buffered-chars", type=int, default=defaults.ws_max_buffered_chars,
                   help="characters of WebSocket text not yet spoken before the connection is closed")
    p.add_argument("--ws-max-contexts", type=int, default=defaults.ws_max_contexts,
                   help="text sessions (contexts) open at once on one WebSocket; one more gets an error event")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def model_aliases(args: argparse.Namespace) -> tuple[str, ...]:
    """OpenAI's model names (unless --no-openai-model-names), then every --model-alias."""
    return (() if args.no_openai_model_names else OPENAI_MODEL_NAMES) + tuple(args.model_aliases)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.metrics_url is None and args.triton_url.startswith(RESOLVER_SCHEMES):
        print("error: --triton-url names several servers: give --metrics-url (one server's, or '' for no "
              "heartbeat check)", file=sys.stderr)
        return 2
    try:
        config = ShimConfig(
            triton_url=args.triton_url, triton_model=args.triton_model,
            model_names=tuple(args.model_names or DEFAULT_MODEL_NAMES), host=args.host, port=args.port,
            model_aliases=model_aliases(args),
            max_body_bytes=args.max_body_bytes, max_input_chars=args.max_input_chars,
            max_reference_bytes=args.max_reference_bytes, reference_dir=args.reference_dir, voices_dir=args.voices_dir,
            allow_url_references=args.allow_url_references, allow_private_url_hosts=args.allow_private_url_hosts,
            url_timeout_s=args.url_timeout, response_timeout_s=args.response_timeout,
            metrics_url=args.metrics_url, heartbeat_stale_s=args.heartbeat_stale,
            ws_idle_timeout_s=args.ws_idle_timeout, ws_max_buffered_chars=args.ws_max_buffered_chars,
            ws_max_contexts=args.ws_max_contexts)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    workers = default_workers() if args.workers is None else args.workers
    if workers < 1:
        print(f"error: --workers must be at least 1, got {workers}", file=sys.stderr)
        return 2
    serve(config, workers, args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
