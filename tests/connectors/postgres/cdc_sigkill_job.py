"""The job ``test_cdc_sigkill.py`` kills and restores: PostgreSQL changes of
``orders`` (REPLICA IDENTITY FULL) -> per-customer amount deltas (an update
or delete retracts its before-image) -> running totals per customer ->
``FileSink``; and every change's identity ``[id, op, lsn]`` -> another
``FileSink``.

Settings: ``EF_CDC_DSN`` (the database), ``EF_CDC_SLOT`` (the slot),
``EF_CDC_UNTIL`` (a file: once it appears, its LSN is where the job ends;
unset: run until killed),
``EF_CDC_CHUNK`` (snapshot chunk size), ``EF_SIGKILL_OUT`` (totals folder),
``EF_CDC_CHANGES`` (changes folder), ``EF_CDC_CHUNKS`` (a file the snapshot
chunks read are logged to, each line prefixed by the process id),
``EF_SIGKILL_CHK`` (checkpoints), ``EF_SIGKILL_INTERVAL`` (seconds).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import eddyflow as ef
from eddyflow.connectors.postgres import PostgresCdcSource


def deltas(change: dict[str, Any]) -> list[list[Any]]:
    """``[customer, amount delta]`` of a change: the before-image retracted."""
    out = []
    if change["op"] in ("u", "d"):
        out.append([change["before"]["customer"], -change["before"]["amount"]])
    if change["after"] is not None:
        out.append([change["after"]["customer"], change["after"]["amount"]])
    return out


def total(delta: list[Any], state: tuple[int, int] | None) -> tuple[list[Any], tuple[int, int]]:
    """``[customer, seq, total]``: the running total after the customer's seq-th delta."""
    seq, amount = state or (0, 0)
    seq, amount = seq + 1, amount + delta[1]
    return [delta[0], seq, amount], (seq, amount)


def identity(change: dict[str, Any]) -> list[Any]:
    """What identifies a change: row id, op and WAL position."""
    row = change["after"] if change["after"] is not None else change["before"]
    return [row["id"], change["op"], change["lsn"]]


def end_at(source: PostgresCdcSource, path: Path) -> None:
    """Sets the source's end once the test writes it (the workload is over)."""
    while not path.exists():
        time.sleep(0.05)
    source.until_lsn = int(path.read_text())


def build(env: ef.StreamEnvironment) -> None:
    chunks = os.environ.get("EF_CDC_CHUNKS")
    if chunks:
        handler = logging.FileHandler(chunks)
        handler.setFormatter(logging.Formatter(f"{os.getpid()} %(message)s"))
        log = logging.getLogger("eddyflow.postgres.cdc")
        log.setLevel(logging.DEBUG)
        log.addHandler(handler)
    env.enable_checkpointing(float(os.environ.get("EF_SIGKILL_INTERVAL", "0.05")),
                             directory=os.environ["EF_SIGKILL_CHK"])
    source = PostgresCdcSource(os.environ["EF_CDC_DSN"], ["public.orders"],
                               slot=os.environ["EF_CDC_SLOT"],
                               chunk_size=int(os.environ.get("EF_CDC_CHUNK", "500")))
    until = os.environ.get("EF_CDC_UNTIL")
    if until:
        threading.Thread(target=end_at, args=(source, Path(until)), daemon=True).start()
    changes = env.from_source(source).name("cdc")
    changes.flat_map(deltas).key_by(0).map_with_state(total).name("totals") \
        .sink_to(ef.FileSink(os.environ["EF_SIGKILL_OUT"]))
    changes.map(identity).sink_to(ef.FileSink(os.environ["EF_CDC_CHANGES"]))
