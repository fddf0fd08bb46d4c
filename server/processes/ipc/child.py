"""evenflow's child processes (front-ends, worker processes) and the engine that starts them:
a child runs ``python -m MODULE`` (exec'd: nothing of the parent's gRPC or CUDA state is
inherited), reads its settings from stdin (4-byte length, then msgpack), and takes the end of
stdin, whose other end only the parent holds, as the parent's death."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import TypeVar

import msgspec

T = TypeVar("T")


async def spawn_python(python_args: Sequence[str], *, settings: object,
                       stderr: int | None = None) -> asyncio.subprocess.Process:
    """Start this interpreter with ``python_args`` and ``settings`` on its stdin (kept open);
    ``stderr``: a file descriptor for its stderr (default: this process's). Cancelled (or
    failing) once the process exists, it kills and reaps the process: no caller could."""
    process = await asyncio.create_subprocess_exec(sys.executable, *python_args,
                                                   stdin=asyncio.subprocess.PIPE,
                                                   stderr=stderr)
    try:
        assert process.stdin is not None
        encoded = msgspec.msgpack.encode(settings)
        process.stdin.write(len(encoded).to_bytes(4, "little") + encoded)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # died at once: wait()
            await process.stdin.drain()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    return process


def _read_exactly(size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            raise EOFError("stdin closed before the settings arrived")
        data += chunk
    return data


def read_settings(kind: type[T]) -> T:
    """In the child: the settings its parent wrote."""
    size = int.from_bytes(_read_exactly(4), "little")
    return msgspec.msgpack.decode(_read_exactly(size), type=kind)


def watch_parent(loop: asyncio.AbstractEventLoop) -> asyncio.Event:
    """In the child: an event set when stdin ends (the parent is gone)."""
    gone = asyncio.Event()

    def on_stdin() -> None:
        with contextlib.suppress(OSError):
            if os.read(0, 4096):
                return
        loop.remove_reader(0)
        gone.set()

    loop.add_reader(0, on_stdin)
    return gone
