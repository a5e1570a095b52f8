"""One execution of a job: where it starts from, and its restarts
(docs/concepts/checkpoints.md, Restore; docs/operations/restore.md).

A :class:`JobExecution` holds the checkpoint folder's lock while it runs,
resolves what it restores (``"latest"``, a ``chk-<n>`` folder, or nothing),
checks that checkpoint against the job, continues its lineage (or draws a
new one), takes back sink output committed after it
(:mod:`~eddyflow.runtime.recovery.supersede`), and runs the job's attempts: after
a retryable failure, as the restart strategy allows, the next attempt
resumes from the latest checkpoint this execution completed, never from one
of an earlier, unrelated run that happens to share the folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterator

import anyio

from eddyflow.checkpoint.commits import commit_record_ids, next_checkpoint_id
from eddyflow.checkpoint.layout import parse_checkpoint_dir
from eddyflow.checkpoint.lock import FolderLock
from eddyflow.checkpoint.metadata import read_checkpoint
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage
from eddyflow.errors import JobFailed, RestoreRefused, is_retryable
from eddyflow.graph.plan import ExecutionPlan
from eddyflow.restart import RestartStrategy
from eddyflow.result import JobResult
from eddyflow.runtime.checkpointing.coordinator import CheckpointConfig
from eddyflow.runtime.job import JobRunner, RuntimeConfig
from eddyflow.runtime.metrics import MetricsReporter
from eddyflow.runtime.operators.io import SinkSpec
from eddyflow.runtime.recovery.restore import RestoredCheckpoint
from eddyflow.runtime.recovery.supersede import supersede_later_output

__all__ = ["JobExecution", "resolve_restore"]

log = logging.getLogger("eddyflow")


def resolve_restore(restore: str | os.PathLike[str] | None, storage: CheckpointStorage | None
                    ) -> RestoredCheckpoint | None:
    """The checkpoint ``restore`` names: ``None`` (a fresh start),
    ``"latest"`` (of ``storage``, the job's checkpoint folder) or the path of
    a ``chk-<n>`` folder, verified with every file it references."""
    if restore is None:
        return None
    if restore == "latest":
        if storage is None:
            return None  # nothing can have been checkpointed: a fresh start
        return _latest_or_refuse(storage)
    path = os.path.abspath(os.fspath(restore))
    n = parse_checkpoint_dir(path)
    if n is None:
        raise ValueError(f"restore={restore!r}: expected 'latest' or a chk-<n> folder")
    at = CheckpointStorage(os.path.dirname(path))
    try:
        meta = read_checkpoint(at, n, verify_files=True)
    except CheckpointCorrupted as exc:
        raise RestoreRefused(f"cannot restore from {path}: {exc}") from exc
    return RestoredCheckpoint(at, n, meta)


def _latest_or_refuse(storage: CheckpointStorage) -> RestoredCheckpoint | None:
    """The latest checkpoint of ``storage`` that verifies; ``None`` for a
    folder where no checkpoint ever completed; refused where some did but
    none verifies: a fresh start there would write the sinks' output again."""
    latest = RestoredCheckpoint.latest(storage)
    if latest is not None:
        return latest
    completed = sorted(set(storage.completed_ids()) | set(commit_record_ids(storage)))
    if not completed:
        return None
    raise RestoreRefused(
        f"restore='latest': no checkpoint in {storage.root} verifies (checkpoints "
        f"{', '.join(map(str, completed))} completed; the warnings above say what is "
        "wrong with each); pass restore=None to start afresh deliberately")


def _report_lost_metadata(storage: CheckpointStorage) -> None:
    """A ``chk-<n>`` folder without ``_metadata`` cannot be restored and is
    removed at start. Say so: normally a checkpoint a crash interrupted
    (its state files may live in ``shared/``), but possibly one whose
    ``_metadata`` was lost — certainly that when its sinks had committed (a
    commit record exists)."""
    committed = set(commit_record_ids(storage))
    layout = storage.layout
    for n in storage.checkpoint_ids():
        meta = layout.metadata(n)
        if os.path.exists(meta) or os.path.exists(layout.superseded_metadata(n)):
            continue
        if n in committed:
            log.warning("checkpoint %d had completed (its sinks committed its output) but "
                        "%s is missing: it cannot be restored and is removed", n, meta)
        else:
            log.warning("%s has no _metadata (a checkpoint a crash interrupted, or one "
                        "whose _metadata was lost): it cannot be restored and is removed",
                        layout.checkpoint_dir(n))


class JobExecution:
    """One execution of a job (``StreamEnvironment.execute_async``): its
    checkpoint folder's lock (:meth:`locked`), what it starts from
    (:meth:`prepare`), and its attempts (:meth:`run`)."""

    def __init__(self, plan: ExecutionPlan, config: RuntimeConfig, job_name: str, *,
                 checkpointing: CheckpointConfig | None,
                 restart_strategy: RestartStrategy,
                 runner_class: type[JobRunner] = JobRunner) -> None:
        self.plan = plan
        #: What runs an attempt: a :class:`JobRunner` in this process, or
        #: its worker-process form (runtime/workers/), which the environment
        #: picks by ``workers`` (recovery does not depend on the workers).
        self.runner_class = runner_class
        self.config = config
        self.job_name = job_name
        self.checkpointing = checkpointing
        self.restart_strategy = restart_strategy
        #: The job's own checkpoint folder, if it checkpoints.
        self.storage = (CheckpointStorage(checkpointing.directory)
                        if checkpointing is not None else None)
        self.sinks = {n.uid: n.payload.sink.for_job(job_name, n.uid) for n in plan.graph.nodes
                      if isinstance(n.payload, SinkSpec)}
        #: What the first attempt restores (set by :meth:`prepare`).
        self.restored: RestoredCheckpoint | None = None
        #: The history this execution's checkpoints belong to (checkpoint/commits.py).
        self.lineage = ""

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the checkpoint folder's lock (if the job checkpoints): a
        second job on the same folder is refused
        (:class:`ef.CheckpointFolderInUse`)."""
        if self.storage is None:
            yield
            return
        with FolderLock(self.storage.root, self.job_name):
            yield

    @property
    def _own(self) -> str | None:
        return self.storage.root if self.storage is not None else None

    @property
    def _journals(self) -> list[CheckpointStorage]:
        """The folders whose commit records say what the sinks committed."""
        restored = self.restored
        return [s for s in (self.storage, restored.storage if restored else None)
                if s is not None]

    async def prepare(self, restore: str | os.PathLike[str] | None, *,
                allow_non_restored_state: bool = False) -> None:
        """Decide what the first attempt starts from (see :func:`resolve_restore`)
        and refuse, before anything runs, a checkpoint the job cannot restore;
        then take back the sink output committed after it and clear the
        folder of checkpoints that never completed. Call holding the lock."""
        storage = self.storage
        if storage is not None:
            _report_lost_metadata(storage)
        restored = self.restored = resolve_restore(restore, storage)
        if restored is not None:
            restored.check_compatible(self.plan,
                                      allow_non_restored_state=allow_non_restored_state)
        # A fresh start draws a new lineage; a restore continues the one of
        # its checkpoint (checkpoint/commits.py).
        self.lineage = (restored.meta.lineage if restored is not None else None) \
            or secrets.token_hex(8)
        if restored is not None:
            await supersede_later_output(restored, self.lineage, self._journals, self.sinks,
                                         own=self._own)
        if storage is not None:
            storage.ensure()
            removed = storage.clean_incomplete()
            if removed:
                log.info("removed incomplete checkpoints %s", removed)

    def _base_of(self, restored: RestoredCheckpoint | None) -> tuple[str, int] | None:
        """The ``base`` of a run's checkpoints (checkpoint/commits.py): a
        restore from the job's own folder inherits its checkpoint's, one from
        another folder is based on that checkpoint; a fresh start has none."""
        if restored is None:
            return None
        if restored.storage.root == self._own:
            return restored.meta.base
        return (restored.storage.root, restored.checkpoint_id)

    async def run(self, reporter: MetricsReporter) -> JobResult:
        """Run the job's attempts (see the module's docstring) while
        ``reporter`` samples its metrics; the result carries the final
        sample. The callbacks see the end of a job that finished; a failed
        one ends in its exception."""
        ok = False
        try:
            async with anyio.create_task_group() as watching:
                watching.start_soon(self._report, reporter, name="metrics-reporter")
                try:
                    result = await self._attempts(reporter)
                    ok = True
                finally:
                    watching.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # Only the attempts raise (the reporter does not): their failure,
            # not the task group's wrapper.
            failure = group.exceptions[0] if len(group.exceptions) == 1 else group
            raise failure from failure.__cause__
        finally:
            result_metrics = reporter.finish(notify=ok)
            reporter.stop_server()
        result.metrics = result_metrics
        return result

    @staticmethod
    async def _report(reporter: MetricsReporter) -> None:
        try:
            await reporter.run()
        except Exception:
            # Watching a job must never fail it (as on_metrics promises).
            log.exception("metrics reporting stopped")

    async def _attempts(self, reporter: MetricsReporter) -> JobResult:
        storage = self.storage
        strategy = self.restart_strategy
        restarts = 0
        completed: list[int] = []
        # A restart resumes from this execution's own checkpoints (or the one
        # it was restored from), never from those of an earlier, unrelated run
        # that happen to share the directory.
        initial = restored = self.restored  # may live in another folder than our own
        used_ids = 1  # ids are never reused within an execution, aborted ones included
        while True:
            next_id = max(next_checkpoint_id(storage) if storage is not None else 1, used_ids)
            runner = self.runner_class(self.plan, self.config, self.job_name,
                                  checkpointing=self.checkpointing, restore=restored,
                                  next_checkpoint_id=next_id, completed_checkpoints=completed,
                                  lineage=self.lineage, base=self._base_of(restored))
            reporter.attach(runner, restarts)
            try:
                result = await runner.run()
            except JobFailed as exc:
                completed = list(runner.coordinator.completed)
                used_ids = runner.coordinator.next_id
                if restarts >= strategy.attempts or not is_retryable(exc):
                    # (A failure that a restart cannot get past, such as a
                    # state value that cannot be pickled, fails the job at
                    # once: retrying would only fail the same way again.)
                    if restarts:
                        exc.add_note(f"the job was restarted {restarts} times")
                    raise
                restarts += 1
                log.warning("job '%s' failed (%s); restart %d of %d", self.job_name, exc,
                            restarts, strategy.attempts)
                await anyio.sleep(strategy.delay)
                restored = initial
                if storage is not None:
                    storage.clean_incomplete()  # the failed attempt's checkpoint in flight
                    latest = RestoredCheckpoint.latest(storage, among=completed)
                    if latest is not None:
                        restored = latest
                    # The latest completed checkpoint may not verify any more:
                    # what the sinks committed after the one resumed from goes.
                    await supersede_later_output(restored, self.lineage, self._journals,
                                           self.sinks, own=self._own)
                continue
            result.restarts = restarts
            return result
