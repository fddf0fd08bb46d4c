"""The child supervisor, against real tiny children (``python -c``): ready, exit while starting
(exit code and stderr in the error), no answer within the bound, stop; and the restart backoff."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from evenflow.balancer.backoff import Backoff
from evenflow.server.processes.ipc import child
from evenflow.server.processes.supervisor import Child, ChildNotReady

pytestmark = pytest.mark.timeout(30)

# Reads its settings like every child does, then waits for stdin to end (the parent is gone).
_WAITS = ("import sys; from evenflow.server.processes.ipc import child; "
          "print(child.read_settings(dict)['greeting'], flush=True); sys.stdin.buffer.read()")
_DIES = "import sys; sys.stderr.write('line one\\nTraceback: boom\\n'); sys.exit(5)"


async def test_a_child_that_dies_while_starting_names_its_exit_code_and_last_words(
        capfd: pytest.CaptureFixture[str]) -> None:
    started = await Child.start("worker w", ["-c", _DIES], settings={})
    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    with pytest.raises(ChildNotReady) as failed:
        await started.until_ready(never, timeout_s=20)
    assert failed.value.exit_code == 5
    assert failed.value.stderr_tail.endswith("Traceback: boom")
    assert "worker w: its process exited with code 5" in str(failed.value)
    assert "Traceback: boom" in str(failed.value)
    assert "Traceback: boom" in capfd.readouterr().err  # passed through to our stderr too


async def test_the_tail_keeps_only_the_last_bytes() -> None:
    code = "import sys; sys.stderr.write('x' * 10000 + 'END'); sys.exit(1)"
    started = await Child.start("c", ["-c", code], settings={}, stderr_tail_bytes=100)
    with pytest.raises(ChildNotReady) as failed:
        await started.until_ready(asyncio.get_running_loop().create_future(), timeout_s=20)
    assert len(failed.value.stderr_tail) == 100 and failed.value.stderr_tail.endswith("END")


async def test_a_child_not_ready_within_the_bound_is_killed() -> None:
    started = await Child.start("front-end 0", ["-c", _WAITS], settings={"greeting": "hi"})
    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    with pytest.raises(ChildNotReady, match=r"front-end 0: not ready within 0\.2 s") as failed:
        await started.until_ready(never, timeout_s=0.2)
    assert failed.value.exit_code is None
    assert started.exit_code is not None  # killed and reaped


async def test_ready_returns_the_signal_and_stop_kills_a_child_that_does_not_exit(
        capfd: pytest.CaptureFixture[str]) -> None:
    started = await Child.start("c", ["-c", _WAITS], settings={"greeting": "hello"})
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    ready.set_result("ready")
    assert await started.until_ready(ready, timeout_s=20) == "ready"
    assert started.exit_code is None
    assert not await started.stop(timeout_s=0.1)  # it waits for stdin's end: killed
    assert started.exit_code is not None
    assert await started.kill() == started.exit_code  # idempotent


async def test_stop_waits_for_a_child_that_exits_by_itself() -> None:
    started = await Child.start("c", ["-c", "pass"], settings={})
    assert await started.stop(timeout_s=20)
    assert await started.wait() == 0


async def test_a_ready_signal_that_fails_raises_its_error() -> None:
    started = await Child.start("c", ["-c", _WAITS], settings={"greeting": "x"})
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    ready.set_exception(ValueError("bad model"))
    try:
        with pytest.raises(ValueError, match="bad model"):
            await started.until_ready(ready, timeout_s=20)
    finally:
        await started.kill()


async def test_a_start_cancelled_while_it_writes_the_settings_kills_its_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The child never reads stdin, so 1 MiB of settings fills the pipe and the start waits:
    # cancelled there, the process exists and no caller holds it.
    spawned: list[asyncio.subprocess.Process] = []
    exists = asyncio.Event()
    real_exec = asyncio.create_subprocess_exec

    async def recording_exec(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        process = await real_exec(*args, **kwargs)
        spawned.append(process)
        exists.set()
        return process

    monkeypatch.setattr(child.asyncio, "create_subprocess_exec", recording_exec)
    starting = asyncio.create_task(Child.start(
        "c", ["-c", "import signal; signal.pause()"], settings={"blob": "x" * (1 << 20)}))
    await exists.wait()
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    (process,) = spawned
    assert process.returncode is not None  # killed and reaped


def test_backoff_doubles_up_to_its_bound_and_resets() -> None:
    backoff = Backoff(0.1, 0.5)
    assert [backoff.next_s() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next_s() == 0.1
    with pytest.raises(ValueError):
        Backoff(0.0, 1.0)
