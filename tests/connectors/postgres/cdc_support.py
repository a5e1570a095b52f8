"""What the CDC tests share: running a bounded CDC job to the WAL position
after a workload, and SQL helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

import eddyflow as ef
from eddyflow.checkpoint.metadata import CheckpointMetadata
from eddyflow.checkpoint.storage import CheckpointStorage
from eddyflow.connectors.postgres import PostgresCdcSource
from eddyflow.connectors.postgres.cdc_protocol import parse_lsn


def sql(dsn: str, *statements: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Runs statements in autocommit; the rows of the last one (if any)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows: list[tuple[Any, ...]] = []
        for s in statements:
            cur = conn.execute(s, params)  # type: ignore[arg-type]
            rows = cur.fetchall() if cur.description else []
        return rows


def wal_lsn(dsn: str) -> int:
    """A WAL position after every transaction committed so far: that of a
    logical decoding message written now (the stream passes it once the WAL
    is flushed; the insert position itself may be a page header the stream
    never reports)."""
    return parse_lsn(sql(dsn, "SELECT pg_logical_emit_message(false, 'eddyflow-test', "
                              "'mark')::text")[0][0])


def confirmed_flush(dsn: str, slot: str) -> int:
    """The slot's confirmed position."""
    return parse_lsn(sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                              "WHERE slot_name = %s", params=(slot,))[0][0])


def cdc_position(chk: Path, checkpoint_id: int, source: str = "cdc") -> Any:
    """The position checkpoint ``checkpoint_id`` holds for the source named
    ``source`` (that of its one split, the slot)."""
    meta = CheckpointMetadata.from_json(CheckpointStorage(chk).read_metadata(checkpoint_id))
    positions = meta.operators[source].subtasks[0].position
    assert isinstance(positions, dict) and len(positions) == 1, positions
    return next(iter(positions.values()))


def run_cdc(source: PostgresCdcSource, chk: Path | None = None, restore: str | None = None,
            fail: ef.testing.FailingMap | None = None,
            batch_size: int | None = None) -> list[dict[str, Any]]:
    """Runs source -> (FailingMap) -> ListSink; the committed records."""
    env = (ef.StreamEnvironment(parallelism=1) if batch_size is None
           else ef.StreamEnvironment(parallelism=1, batch_size=batch_size))
    if chk is not None:
        env.enable_checkpointing(0.05, directory=str(chk), retained=100_000)
    if fail is not None:
        env.set_restart_strategy(ef.FixedDelayRestart(attempts=10, delay=0.0))
    sink = ef.ListSink()
    stream = env.from_source(source).name("cdc")
    if fail is not None:
        stream = stream.map(fail)
    stream.sink_to(sink)
    env.execute("cdc", restore=restore)
    return sink.results
