"""CallReader: one tritonclient.grpc.aio `stream_infer` call, read by a task of its own.

Why: grpc.aio cancels the whole RPC when a pending read is cancelled (grpc/aio/_call.py, `_read`),
and the shim's readers are cancelled all the time (an HTTP client leaves, a WebSocket context is
cancelled, a response timeout fires). A cancelled RPC is the gRPC cancel that tritonserver 2.51's
stream handler races against a response being sent (docs/structure.md, "A wedge of 2.51's gRPC
stream handler"), and it would take the in-band STOP's answers with it. So the call is read into a
queue by a task nobody cancels, and consumers take from the queue: a cancelled `Queue.get()` costs
nothing and loses no response (asyncio.Queue pops only on a completed get).

Items are (result, error) pairs as the call yields them; after the last, `next()` raises: the call
ended (StopAsyncIteration: its status came), failed (grpc.aio.AioRpcError), or was cancelled here.
The reader itself counts the final responses (an error response, or a final flag) and keeps the
ids of those with a final flag, before any consumer sees them: an ending (a STOP's wait for its
finals) waits on those counts, whoever takes the items from the queue.
"""

from __future__ import annotations

import asyncio
from typing import Optional

# Reader tasks, and the endings (STOPs, half-closes) that outlive a cancelled handler: asyncio
# keeps only weak references to tasks. The shim's channel is closed only once ENDINGS are done.
READERS: set[asyncio.Task] = set()
ENDINGS: set[asyncio.Task] = set()


def keep(task: asyncio.Task, tasks: set = READERS) -> asyncio.Task:
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


class CallEnded(Exception):
    """The call ended while a response was awaited; `cause` is the call's error (None: its status came)."""

    def __init__(self, cause: Optional[BaseException]) -> None:
        super().__init__(repr(cause))
        self.cause = cause


class CallReader:
    def __init__(self, call) -> None:
        self.call = call
        self._items: asyncio.Queue = asyncio.Queue()
        self._end: Optional[CallEnded] = None
        self.finals = 0  # final responses read so far (error responses included)
        self.final_ids: set[str] = set()  # ids of the responses read with a final flag
        self.is_ended = False  # the call ended (status, error or cancel); nothing more will come
        self._changed = asyncio.Condition()
        self.task = keep(asyncio.ensure_future(self._read_all()))

    async def _read_all(self) -> None:
        try:
            async for item in self.call:
                result, error = item
                if error is not None or is_final(result):
                    self.finals += 1
                    if error is None:
                        self.final_ids.add(result.get_response().id)
                    await self._notify()
                self._items.put_nowait(item)
        except BaseException as exc:  # AioRpcError, or CancelledError once the call was cancelled
            self._ended(CallEnded(exc))
            if not isinstance(exc, Exception):
                raise
        else:
            self._ended(CallEnded(None))

    def _ended(self, end: CallEnded) -> None:
        self.is_ended = True
        self._items.put_nowait(end)
        keep(asyncio.ensure_future(self._notify()))  # from an except block, maybe a cancelled task: its own

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def next(self, timeout_s: float):
        """The next (result, error); TimeoutError when none comes in time; CallEnded once the call
        has ended (again at every later call)."""
        if self._end is not None:
            raise self._end
        async with asyncio.timeout(timeout_s):  # wait_for would make a task per response
            item = await self._items.get()
        if isinstance(item, CallEnded):
            self._end = item
            raise item
        return item

    async def until_finals(self, total: int, timeout_s: float) -> bool:
        """Wait until the call has brought `total` final responses since it began (the consumer need
        not read them): True; False when the call ends or the time runs out first."""
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: self.finals >= total or self.is_ended)
        except TimeoutError:
            pass
        return self.finals >= total

    async def until_status(self, timeout_s: float) -> bool:
        """Wait for the call's status (the caller has half-closed it): True, or False after
        `timeout_s`. What comes meanwhile is dropped."""
        done, _ = await asyncio.wait({self.task}, timeout=timeout_s)  # never cancels the reader
        return bool(done)


async def queued_requests(requests: asyncio.Queue):
    """A `stream_infer` call's request iterator: each request put in `requests`, in order, until None,
    which half-closes the call (half-closing early would end the stream before its responses)."""
    while (request := await requests.get()) is not None:
        yield request


def is_final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param
