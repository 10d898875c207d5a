"""What the sinks of table formats (Delta Lake, Iceberg) share: each subtask writes its rows
into Parquet **part files** of the table while they come, on a thread of its own, and closes
them at every barrier; the driver's global committer then adds every subtask's files of a
checkpoint to the table in one commit.

* ``parts.py``: :class:`PartFile` (one open file, rows appended as row groups) and
  :class:`PartFiles` (a writer's files of one checkpoint interval, one open per partition;
  rolled when large or when too many are open), named so that the job, the sink, the subtask
  and the checkpoint can be read back from a file's name (:func:`named`);
* ``writer.py``: :class:`PartWriter`, the subtask's writer around them: rows gathered into
  row groups and handed to the thread, the files closed at the barrier and awaited on the
  snapshot thread (:class:`FilesToWrite`).

A format says what differs: where a file goes and how it is opened, how rows are split into
partitions, what its commit needs of a closed file (the statistics in its own form), and the
table's schema the rows are made to fit.
"""
