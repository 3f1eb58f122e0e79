"""StopRequests: `moss_tts`'s answer to an in-band STOP, a request of its own on the client's stream
that names a running request's gRPC id (contract/tensors.py, STOP).

The named request is marked stopped in the model's RequestLedger; its stream reads that as its
client's cancel at its next check (a chunk, or within a second while it waits), ends its engine row
and vocoder sequence, and sends its one final response, `[CANCELLED]`. The STOP itself gets one
empty final response, whether or not its request was still running (a request that ended first is
not an error: the client's stop and the request's end race). With several instances of the model,
a STOP that reached an instance not running its request asks the others over their relay sockets
(sessions/relay.ask_stop) on a thread of its own, so execute() never waits on a socket.

Why an in-band stop at all: a client's gRPC cancel, processed while a response of the stream is
being sent, can wedge tritonserver 2.51's stream handler for good (issue 34, round 18) or crash it
(round 19: a response callback reading a stream state freed by the cancel). Our own clients stop
this way (client/tts_client.py, the OpenAI shim); a client's cancel still works, with that risk.
No Triton import: the final flag's value is passed in.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Optional

from ..pipeline.synthesis_request import parse_stop_input
from ..sessions.relay import ask_stop
from .request_ledger import RequestLedger, TrackedSender
from .stall_watch import StallWatch

log = logging.getLogger(__name__)


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
        if self.ledger.stop(request_id, by=sender) or not self._has_peers():
            self._final(sender)
        else:
            threading.Thread(target=self._ask_peers, args=(sender, request_id), name="moss-tts-stop",
                             daemon=True).start()
        return True

    def _has_peers(self) -> bool:
        directory = self.own_socket.parent
        return any(path != self.own_socket for path in directory.glob("*.sock")) if directory.is_dir() else False

    def _ask_peers(self, sender: TrackedSender, request_id: str) -> None:
        try:
            stopped = self.ask_others(self.own_socket.parent, self.own_socket, request_id)
            log.debug("STOP %r: %d stopped on other instances", request_id, stopped)
        except Exception:  # never leave the STOP without its final response
            log.exception("STOP %r: asking the other instances failed", request_id)
        self._final(sender)

    def _final(self, sender: TrackedSender) -> None:
        with self.watch.working("a STOP's final response send"):
            sender.send(flags=self.final_flag)
