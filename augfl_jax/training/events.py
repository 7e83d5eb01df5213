"""TensorBoard scalars of a run, complete after any crash and resume.

Written as TensorBoard's event files (TFRecord-framed ``Event`` protos) with
the ``tensorboard`` package's protos and record framing only: no
TensorFlow, no torch, no writer thread. (The package's ``EventFileWriter``
imports TensorFlow where it is installed, which costs seconds and prints
TensorFlow's notices; the package is needed to view the events anyway:
``tensorboard --logdir runs``.) The import is lazy, after the run's checks.

Each event is framed in memory and written with one unbuffered ``write``,
so a crash leaves whole events on disk, at most the last one cut short,
which TensorBoard skips.

Completeness: the loop flushes the events before every checkpoint, so the
events of every round up to a checkpoint are on disk when it is. A resumed
run first writes a ``SessionLog(START)`` at the round after its checkpoint;
TensorBoard then drops whatever the crashed run wrote from that round on,
and the resumed run writes those rounds again.
"""

from __future__ import annotations

import io
import itertools
import os
import socket
import time

__all__ = ["EventWriter"]

_file_ids = itertools.count()  # two writers of one process, same second


class EventWriter:
  """Scalars to ``logdir`` (one ``events.out.tfevents.*`` file per session).

  Args:
    logdir: the directory of the event files (created if missing); None:
      write nothing (a process of a run across processes other than the
      writer).
    resume_from: the first round this session writes when it continues a
      run (older events of that round and later are discarded by
      TensorBoard); ``None`` for a fresh run.
  """

  def __init__(self, logdir: str | None, resume_from: int | None = None):
    self._file = None
    if logdir is None:
      return
    # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter
    self._event, self._summary = event_pb2, summary_pb2
    os.makedirs(logdir, exist_ok=True)
    name = (f"events.out.tfevents.{int(time.time()):010d}."
            f"{socket.gethostname()}.{os.getpid()}.{next(_file_ids)}")
    # pylint: disable-next=consider-using-with
    self._file = open(os.path.join(logdir, name), "wb", buffering=0)
    self._frame = io.BytesIO()
    self._records = RecordWriter(self._frame)
    self._add(event_pb2.Event(wall_time=time.time(),
                              file_version="brain.Event:2"))
    if resume_from is not None:
      self._add(event_pb2.Event(
          wall_time=time.time(), step=resume_from,
          session_log=event_pb2.SessionLog(
              status=event_pb2.SessionLog.START)))

  def _add(self, event) -> None:
    """Frames ``event`` and writes it in one call."""
    self._frame.seek(0)
    self._frame.truncate()
    self._records.write(event.SerializeToString())
    data = memoryview(self._frame.getvalue())
    while data:  # a regular file takes it whole, but for a full disk
      data = data[self._file.write(data):]

  def scalars(self, values: dict[str, float], step: int,
              prefix: str = "") -> None:
    """One event holding ``prefix + name`` scalars at ``step``."""
    if self._file is None:
      return
    summary = self._summary.Summary(value=[
        self._summary.Summary.Value(tag=prefix + name,
                                    simple_value=float(value))
        for name, value in values.items()])
    self._add(self._event.Event(wall_time=time.time(), step=step,
                                summary=summary))

  def flush(self) -> None:
    """Everything added so far is in the file (the OS's buffers): each
    event was written unbuffered when it was added."""
    if self._file is not None:
      self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
