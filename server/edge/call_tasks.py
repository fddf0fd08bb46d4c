"""grpc.aio's own tasks for the calls it serves, and the wait, after ``grpc.aio.Server.stop``,
until the last of them has ended.

grpc.aio runs each call in two tasks of its own: ``_schedule_rpc_coro`` waits for gRPC core to
close the call, then awaits ``_handle_exceptions``, which runs the handler. ``Server.stop``
returns once the server's connections are gone, not once these tasks have ended: a call whose
connection closed under it (one refused after the drain, one in flight as the port closed) can
still be finishing, or be finished but for the turn of the loop that wakes the task awaiting
it. Whatever cancels the awaiting task then makes grpc log a traceback ("Exception not
handled by _handle_exceptions in servicer method [...]", a CancelledError at
``await rpc_task``), and ``asyncio.run`` cancels every task left when a process's main
coroutine returns. (gRPC core cancelling a call cancels only the handler's task, whose
CancelledError grpc catches quietly.) Waiting for them after the stop leaves none to cancel.

The tasks are told by the names of grpc's coroutines (grpcio 1.85; ``test_call_tasks`` fails
if an upgrade renames them), among all the running loop's tasks: those of every grpc.aio
server on the loop, which in a server or front-end process is this port's alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

# The coroutines grpc.aio runs each call's tasks on (grpc/_cython/_cygrpc/aio/server.pyx.pxi).
_CALL_COROUTINES = frozenset({"_schedule_rpc_coro", "_handle_exceptions"})

CallTasks = Callable[[], set["asyncio.Task[Any]"]]


def grpc_call_tasks() -> set[asyncio.Task[Any]]:
    """grpc.aio's tasks of the calls it serves on the running loop, not yet done."""
    return {task for task in asyncio.all_tasks()
            if not task.done()
            and getattr(task.get_coro(), "__qualname__", None) in _CALL_COROUTINES}


async def calls_ended(timeout_s: float, call_tasks: CallTasks = grpc_call_tasks) -> int:
    """Wait (up to ``timeout_s``) until ``call_tasks`` finds none, without cancelling any;
    returns how many are left."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            # Looked for again after each wait: a call's first task starts its second.
            while left := call_tasks():
                await asyncio.wait(left)
    return len(call_tasks())
