"""Session relay: a text-session request that reached a `moss_tts` instance other than the one
holding its session is spoken by the holder, and its audio comes back through the instance that
received it (which owns the client's gRPC stream).

With several instances in one tritonserver (`configs/replicas_*`) Triton hands each request to
whichever instance is free, and BLS cannot name an instance. The session lives in its holder's
process (the voice, the one vocoder sequence: registry.py, SessionClaims names the holder),
so the receiving instance forwards the request to the holder over a Unix socket in the claims
directory (`<directory>/<instance>.sock`, the directory 0700) and sends what comes back to its
client. A cancel closes the socket; the holder sees it as the request's cancel. No Triton import.

The same sockets carry an in-band STOP that reached an instance not running the request it names
(serving/stop_requests.ask_stop asks every other instance: `{"stop": id}` -> `{"stopped": n}`).

Messages: a 4-byte big-endian length, then JSON. Arrays travel as dtype, shape and base64 bytes
(BYTES tensors as a list of base64 strings); no pickle: a message is data, never code.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import select
import socket
import struct
import threading
from contextlib import closing
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..contract.errors import SHUTTING_DOWN, ErrorKind, error_text
from .claims import private_directory

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 2**20  # a relayed request with its reference audio, or one audio chunk
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0  # a message already begun must arrive whole within this


def socket_path(directory: Path, instance: str) -> Path:
    return Path(directory) / f"{instance}.sock"


def encode_array(array) -> dict:
    array = np.asarray(array)
    if array.dtype == np.object_:
        items = [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)]
        return {"bytes": [base64.b64encode(v).decode() for v in items], "shape": list(array.shape)}
    array = np.ascontiguousarray(array)
    return {"dtype": array.dtype.str, "shape": list(array.shape), "data": base64.b64encode(array.tobytes()).decode()}


def decode_array(value: dict) -> np.ndarray:
    if "bytes" in value:
        items = [base64.b64decode(v) for v in value["bytes"]]
        out = np.empty(len(items), dtype=np.object_)
        out[:] = items
        return out.reshape(value["shape"])
    dtype = np.dtype(value["dtype"])
    if dtype.hasobject:
        raise ValueError("object arrays travel as 'bytes'")
    return np.frombuffer(base64.b64decode(value["data"]), dtype=dtype).reshape(value["shape"]).copy()


def write_message(sock: socket.socket, message: dict) -> None:
    body = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def read_message(sock: socket.socket) -> Optional[dict]:
    """The next message; None at the peer's end of stream."""
    header = _read_exactly(sock, 4)
    if header is None:
        return None
    (size,) = struct.unpack(">I", header)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"relay message of {size} bytes (limit {MAX_MESSAGE_BYTES})")
    body = _read_exactly(sock, size)
    if body is None:
        raise ConnectionError("relay connection closed inside a message")
    return json.loads(body)


def _read_exactly(sock: socket.socket, size: int) -> Optional[bytes]:
    chunks, got = [], 0
    while got < size:
        chunk = sock.recv(min(size - got, 1 << 20))
        if not chunk:
            if got:
                raise ConnectionError("relay connection closed inside a message")
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def request_message(inputs: dict[str, np.ndarray], requested: list[str], request_id: str) -> dict:
    return {"inputs": {name: encode_array(value) for name, value in inputs.items()},
            "requested": list(requested), "request_id": request_id}


def message_getter(message: dict) -> Callable[[str], Optional[np.ndarray]]:
    inputs = {name: decode_array(value) for name, value in message["inputs"].items()}
    return inputs.get


class RelayClient:
    """The holder's side: the relayed request's client (TritonClient's interface), whose responses
    go back over the connection. The connection closes after the final response; a receiving
    instance that closed it first (its client cancelled, or it stops) is this request's cancel."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        # A receiving instance that stops reading must not hold this stream (and its session's
        # turn) forever: a write that cannot go out in this time ends the request as a cancel.
        conn.settimeout(READ_TIMEOUT_S)
        self._lock = threading.Lock()
        self._is_gone = False

    def send(self, audio, codes, context, final):
        arrays = {name: encode_array(v) for name, v in (("AUDIO", audio), ("CODES", codes), ("CONTEXT_CODES", context))
                  if v is not None}
        self._write({"send": arrays, "final": bool(final)}, final)

    def send_error(self, message, kind):
        self._write({"error": str(message), "kind": ErrorKind(kind).value}, True)

    def send_final(self):
        self._write({"final_only": True}, True)

    def is_cancelled(self) -> bool:
        if self._is_gone:
            return True
        try:  # readable with nothing to read: the other side closed (it sends nothing after the request)
            if select.select([self.conn], [], [], 0)[0] and self.conn.recv(1, socket.MSG_PEEK) == b"":
                self._is_gone = True
        except (OSError, ValueError):  # ValueError: closed here already
            self._is_gone = True
        return self._is_gone

    def _write(self, message: dict, final: bool) -> None:
        with self._lock:
            if not self._is_gone:
                try:
                    write_message(self.conn, message)
                except OSError:  # the receiving instance went away: the stream sees a cancel
                    self._is_gone = True
            if final:
                self._is_gone = True
                self.conn.close()


class RelayServer:
    """The holder's side: accepts relayed requests on `path`; `accept(message, client)` admits one
    (it must not block: the request runs on the holder's stream pool). A STOP from another
    instance is answered with `stop(request_id)`: how many requests of that id it stopped."""

    def __init__(self, path: Path, accept: Callable[[dict, RelayClient], None],
                 stop: Callable[[str], int] = lambda request_id: 0) -> None:
        self.path, self.accept, self.stop_request = Path(path), accept, stop
        private_directory(self.path.parent)
        self.path.unlink(missing_ok=True)  # left by an earlier stub of this instance
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._sock.listen(64)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="moss-tts-session-relay", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed by stop()
            threading.Thread(target=self._one, args=(conn,), name="moss-tts-relay-in", daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        client = RelayClient(conn)  # its timeout bounds this read too
        try:
            message = read_message(conn)
            if message is None:
                conn.close()
                return
            if "stop" in message:
                stopped = self.stop_request(str(message["stop"]))
                with closing(conn):
                    try:
                        write_message(conn, {"stopped": stopped})
                    except OSError:  # the asking instance gave up waiting: nothing to answer
                        pass
                return
            self.accept(message, client)
        except Exception as exc:  # a malformed message: answered, never the relay's end
            log.exception("relayed request failed")
            client.send_error(f"internal error: relayed request: {error_text(exc)}", ErrorKind.INTERNAL)

    def stop(self) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self.path.unlink(missing_ok=True)


def relay(path: Path, message: dict, client, is_cancelled: Callable[[], bool],
          is_stopping: Callable[[], bool], poll_s: float = 0.25) -> None:
    """The receiving side: send the request to the holder at `path`, pass each response to `client`
    (TritonClient's interface) until the final one; exactly one final response reaches `client`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(str(path))
        write_message(sock, message)
    except OSError as exc:
        sock.close()
        client.send_error(f"the instance holding this text session cannot be reached ({error_text(exc)}); start a new "
                          f"session", ErrorKind.UNAVAILABLE)
        return
    sock.settimeout(READ_TIMEOUT_S)  # within a message; between messages select() waits
    try:
        while True:
            # Checked before every message, as a stream checks before every chunk: with audio
            # flowing the socket is always readable.
            if is_stopping():
                client.send_error(SHUTTING_DOWN, ErrorKind.UNAVAILABLE)
                return
            if is_cancelled():
                client.send_error("request cancelled by the client", ErrorKind.CANCELLED)
                return
            if not select.select([sock], [], [], poll_s)[0]:
                continue
            answer = read_message(sock)
            if answer is None:
                client.send_error("the instance holding this text session stopped answering", ErrorKind.UNAVAILABLE)
                return
            if "error" in answer:
                client.send_error(answer["error"], ErrorKind(answer["kind"]))
                return
            if answer.get("final_only"):
                client.send_final()
                return
            arrays = {name: decode_array(v) for name, v in answer["send"].items()}
            final = bool(answer["final"])
            client.send(arrays.get("AUDIO"), arrays.get("CODES"), arrays.get("CONTEXT_CODES"), final)
            if final:
                return
    except (OSError, ValueError) as exc:
        client.send_error(f"relay to the instance holding this text session failed: {error_text(exc)}",
                          ErrorKind.UNAVAILABLE)
    except Exception as exc:  # never leave the client without its final response
        log.exception("session relay failed")
        client.send_error(f"internal error: session relay: {error_text(exc)}", ErrorKind.INTERNAL)
    finally:
        sock.close()


class RelayedStream:
    """The receiving side's stream: runs on its stream pool like any stream and sends exactly one
    final response (`relay`)."""

    def __init__(self, path: Path, message: dict, client, is_stopping: Callable[[], bool]) -> None:
        self.path, self.message, self.client, self.is_stopping = path, message, client, is_stopping

    def run(self) -> None:
        relay(self.path, self.message, self.client, self.client.is_cancelled, self.is_stopping)
