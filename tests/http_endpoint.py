"""HttpEndpoint: a local HTTP server that answers every GET with what `body()` returns (fake
metrics endpoints, a reference file), for tests of clients that read URLs. body() runs on the
server's threads, one per request, several at once: state it changes lives in shared_state.py."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class HttpEndpoint:
    def __init__(self, body: Callable[[], bytes], path: str = "/metrics") -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                data = body()  # once per request: a body may change between scrapes
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
