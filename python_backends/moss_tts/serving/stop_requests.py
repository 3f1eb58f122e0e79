"""StopRequests: `moss_tts`'s answer to an in-band STOP, a request of its own on the client's stream
that names a running request's gRPC id (contract/tensors.py, STOP).

The named request is marked stopped in the model's RequestLedger; its stream reads that as its
client's cancel at its next check (a chunk, or within a second while it waits), ends its engine row
and vocoder sequence, and sends its one final response, `[CANCELLED]`. The STOP itself gets one
empty final response, whether or not its request was still running (a request that ended first is
not an error: the client's stop and the request's end race). With several instances of the model,
a STOP that reached an instance not running its request asks the others over their relay sockets
(`ask_stop`) on a thread of its own, so execute() never waits on a socket.

Why an in-band stop at all: a client's gRPC cancel, processed while a response of the stream is
being sent, can wedge tritonserver 2.51's stream handler for good (issue 34, round 18) or crash it
(round 19: a response callback reading a stream state freed by the cancel). Our own clients stop
this way (client/tts_client.py, the OpenAI shim); a client's cancel still works, with that risk.
No Triton import: the final flag's value is passed in.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Callable, Optional

from ..contract.errors import error_text
from ..pipeline.synthesis_request import parse_stop_input
from ..sessions.relay import read_message, write_message
from .request_ledger import RequestLedger, TrackedSender
from .stall_watch import StallWatch

log = logging.getLogger(__name__)
# How long a STOP that found nothing still stops a request of its id that comes later (several
# instances only: RequestLedger.stop). Longer than a client waits for the STOP's answer (5 s).
REMEMBER_S = 10.0
STOP_ASK_S = 1.0  # all the instances together; a client waits 5 s for its STOP's answer


def ask_stop(directory: Path, own: Path, request_id: str, timeout_s: float = STOP_ASK_S) -> int:
    """Ask every other instance of this server (the relay sockets in `directory` but `own`) to stop
    the request `request_id`, all at once, within `timeout_s` in all: how many they stopped. An
    instance that cannot be reached, or does not answer in time, counts 0."""
    answers: list[int] = []

    def ask(path: Path) -> None:
        try:
            with closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as sock:
                sock.settimeout(timeout_s)
                sock.connect(str(path))
                write_message(sock, {"stop": request_id})
                answer = read_message(sock) or {}
            answers.append(int(answer.get("stopped", 0)))  # list.append: one step under the GIL
        except (OSError, ValueError) as exc:  # an instance stopping or gone: it runs nothing to stop
            log.warning("STOP %r: instance socket %s did not answer: %s", request_id, path.name, error_text(exc))

    threads = [threading.Thread(target=ask, args=(path,), name="moss-tts-stop-ask", daemon=True)
               for path in sorted(Path(directory).glob("*.sock")) if path != Path(own)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return sum(answers)


class StopRequests:
    def __init__(self, ledger: RequestLedger, own_socket: Path, watch: StallWatch, final_flag: int,
                 ask_others: Callable[[Path, Path, str], int] = ask_stop) -> None:
        self.ledger = ledger
        self.own_socket = Path(own_socket)
        self.watch = watch
        self.final_flag = final_flag
        self.ask_others = ask_others

    def answered(self, get, sender: TrackedSender) -> bool:
        """True when the request (inputs `get`, with `get.names`) is a STOP, now answered or being
        answered; False for any other request. A malformed STOP raises InvalidRequest."""
        request_id: Optional[str] = parse_stop_input(get, get.names)
        if request_id is None:
            return False
        self.ledger.classify(sender, "stop")
        try:  # from here the STOP gets exactly one final, whatever fails
            # The instances' sockets are looked at only when this one runs no such request: a
            # single instance (the served layout) answers without touching the directory.
            if (self.ledger.stop(request_id, by=sender) or not self._has_peers()
                    or self.ledger.stop(request_id, by=sender, remember_s=REMEMBER_S)):
                self._final(sender)
            else:
                threading.Thread(target=self._ask_peers, args=(sender, request_id), name="moss-tts-stop",
                                 daemon=True).start()
        except Exception:
            log.exception("STOP %r failed; answered all the same", request_id)
            if not sender.is_final_sent:
                self._final(sender)
        return True

    def stop_from_peer(self, request_id: str) -> int:
        """Another instance's STOP (sessions/relay.RelayServer): requests stopped here."""
        return self.ledger.stop(request_id, remember_s=REMEMBER_S)

    def _has_peers(self) -> bool:
        directory = self.own_socket.parent
        return any(path != self.own_socket for path in directory.glob("*.sock")) if directory.is_dir() else False

    def _ask_peers(self, sender: TrackedSender, request_id: str) -> None:
        try:
            stopped = self.ask_others(self.own_socket.parent, self.own_socket, request_id)
            log.debug("STOP %r: %d stopped on other instances", request_id, stopped)
        except Exception:  # never leave the STOP without its final response
            log.exception("STOP %r: asking the other instances failed", request_id)
        try:
            self._final(sender)
        except Exception:  # the client is gone, or the model is being unloaded
            log.exception("STOP %r: its final response could not be sent", request_id)

    def _final(self, sender: TrackedSender) -> None:
        with self.watch.working("a STOP's final response send"):
            sender.send(flags=self.final_flag)
