"""Joining a batch's rows and cutting its outputs per job."""

from __future__ import annotations

import numpy as np
import pytest

from evenflow.server.workers.batch_rows import join_rows, split_rows

pytestmark = pytest.mark.timeout(30)


def test_jobs_rows_join_per_input_and_split_back_per_job() -> None:
    first = [np.arange(2 * 3).reshape(2, 3), np.array([1, 2])]
    second = [np.arange(100, 103).reshape(1, 3), np.array([3])]
    joined = join_rows([first, second])
    np.testing.assert_array_equal(joined[0], np.vstack([first[0], second[0]]))
    np.testing.assert_array_equal(joined[1], [1, 2, 3])
    back = split_rows(joined, [2, 1])
    for job, original in zip(back, [first, second], strict=True):
        for got, want in zip(job, original, strict=True):
            np.testing.assert_array_equal(got, want)
            assert np.shares_memory(got, joined[0]) or np.shares_memory(got, joined[1])


def test_one_job_crosses_as_it_is_unless_torch_needs_it_writable() -> None:
    view = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), np.float32)  # read-only
    (same,) = join_rows([[view]])
    assert same is view
    (fresh,) = join_rows([[view]], writable=True)
    assert fresh.flags.writeable and not np.shares_memory(fresh, view)
    np.testing.assert_array_equal(fresh, view)


def test_one_job_gets_the_whole_outputs() -> None:
    outputs = [np.zeros((3, 2))]
    (job,) = split_rows(outputs, [3])
    assert job[0] is outputs[0]
