"""The helper that reads a server's start-up banner (tests and benchmarks use it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.harness import wait_for_line

pytestmark = pytest.mark.timeout(30)


def spawn(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_finds_a_line_that_arrived_in_the_same_write_as_the_one_before() -> None:
    # Both lines reach the pipe at once; a buffered readline under select would read both and
    # then wait on select for a line it already holds.
    proc = spawn("import sys, time; sys.stdout.write('metrics on http://x/metrics\\n"
                 "evenflow listening on 127.0.0.1:1\\n'); sys.stdout.flush(); time.sleep(30)")
    try:
        line, before = wait_for_line(proc, "listening on ", timeout_s=10)
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert line == "evenflow listening on 127.0.0.1:1"
    assert before == ["metrics on http://x/metrics"]


def test_returns_none_when_the_process_ends_without_the_line() -> None:
    proc = spawn("print('starting'); print('failed')")
    try:
        line, before = wait_for_line(proc, "listening on ", timeout_s=10)
    finally:
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    assert line is None
    assert before == ["starting", "failed"]
