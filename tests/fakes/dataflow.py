"""Dataflow, faked where a submitted job comes back: the runner's result object."""

from __future__ import annotations


class FakeDataflowResult:
    """Stands in for DataflowPipelineResult: a job id and a terminal state, no job behind it.

    Args:
        job_id: what `job_id()` answers (Dataflow's `YYYY-MM-DD_HH_MM_SS-<n>` form).
        state: what `wait_until_finish()` answers.
    """

    def __init__(
        self, job_id: str = "2026-12-02_10_00_00-123", state: str = "JOB_STATE_DONE"
    ) -> None:
        self._job_id, self._state = job_id, state

    def job_id(self) -> str:
        return self._job_id

    def wait_until_finish(self) -> str:
        return self._state
