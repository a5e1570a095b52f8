"""PostgreSQL: a change-data-capture source (logical decoding with ``pgoutput``)
and an exactly-once sink (two-phase commit), plus a temporary server for tests
and examples (:mod:`eddyflow.connectors.postgres.server`).

Needs the ``postgres`` extra (``pip install 'eddyflow[postgres]'``: psycopg 3).
"""

from __future__ import annotations

from eddyflow.connectors.postgres.cdc import PostgresCdcError, PostgresCdcSource
from eddyflow.connectors.postgres.sink import PostgresSink, PostgresSinkError

__all__: list[str] = ["PostgresCdcError", "PostgresCdcSource", "PostgresSink", "PostgresSinkError"]
