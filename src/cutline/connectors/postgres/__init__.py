"""The PostgreSQL sink (psycopg 3): insert or upsert, **exactly once**, by two-phase commit.

Each subtask writes the rows of a checkpoint interval in one transaction of its own (batched:
``COPY`` for inserts, one ``INSERT ... SELECT FROM unnest(...) ON CONFLICT`` per batch for
upserts). At the checkpoint's barrier it **prepares** the transaction
(``PREPARE TRANSACTION``): the rows are on disk, invisible, and survive a crash of the
writer or of the server. When the checkpoint is complete it commits it
(``COMMIT PREPARED``). The transaction's id names the job, the sink, the subtask and the
checkpoint: ``cutline:<job>:<sink>:<subtask>:<checkpoint>``.

After a restore each writer looks up the prepared transactions of its job's sink in
``pg_prepared_xacts`` (those of the old subtasks it takes over): it commits the ones the
restored checkpoint holds (their checkpoint completed; the commit may not have happened) and
rolls back every other one (prepared for a checkpoint that never completed). So no row is
lost, none is written twice, and no transaction is left holding locks.

A row the server refuses (a value its column cannot take, a constraint it breaks) is found
and named, with its column, its value and its record, and the rest of its batch is written
(:mod:`cutline.connectors.postgres.rows`): it fails the job, or goes to the dead letters.

The server must allow prepared transactions: ``max_prepared_transactions`` at least the
sink's parallelism times the checkpoints that may be in flight (PostgreSQL's default is 0).

The modules, by role: :mod:`~cutline.connectors.postgres.sink` (the sink and what is checked
when the job is built), :mod:`~cutline.connectors.postgres.table` (the table's columns, and
which fields can go into them), :mod:`~cutline.connectors.postgres.rows` (sending rows,
finding those refused), :mod:`~cutline.connectors.postgres.writer` (a subtask's
transactions).
"""

from cutline.connectors.postgres.server import CONNECT_TIMEOUT, transaction_id, transaction_prefix
from cutline.connectors.postgres.sink import BATCH_ROWS, PostgresSink
from cutline.connectors.postgres.writer import PostgresWriter

__all__ = [
    "BATCH_ROWS",
    "CONNECT_TIMEOUT",
    "PostgresSink",
    "PostgresWriter",
    "transaction_id",
    "transaction_prefix",
]
