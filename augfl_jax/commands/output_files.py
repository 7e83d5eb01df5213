"""A command's output files, checked before any work: a file that can be
written (:func:`check_output_file`), a figure in a format matplotlib writes
(:func:`check_figure_file`)."""

from __future__ import annotations

import os
import tempfile

__all__ = ["check_figure_file", "check_output_file", "figure_formats"]


def check_output_file(path: str, flag: str = "--output") -> None:
  """Checks, before any work, that the file ``path`` can be written: not a
  directory, in a directory that exists and where a file can be created.

  Raises:
    ValueError: one line saying what is wrong with ``path``.
  """
  full = os.path.abspath(path)
  parent = os.path.dirname(full)
  if os.path.isdir(full):
    raise ValueError(f"{flag}={path} is a directory: name a file in it")
  if not os.path.isdir(parent):
    what = ("is not a directory" if os.path.exists(parent)
            else "does not exist: create it first")
    raise ValueError(f"{flag}={path}: {parent} {what}")
  if os.path.exists(full) and not (os.path.isfile(full)
                                   and os.access(full, os.W_OK)):
    raise ValueError(f"{flag}={path}: it exists and is not a file that can "
                     "be written; name another")
  try:
    with tempfile.NamedTemporaryFile(dir=parent, prefix=".probe-"):
      pass
  except OSError as e:
    raise ValueError(f"{flag}={path}: a file cannot be created in {parent} "
                     f"({e.strerror or e}); name another directory") from None


def figure_formats() -> tuple[str, ...]:
  """The suffixes a figure's file may have: the formats matplotlib writes
  (not pgf, which needs LaTeX, nor raw RGBA)."""
  from matplotlib import backend_bases  # pylint: disable=g-import-not-at-top
  writes = backend_bases.FigureCanvasBase.get_supported_filetypes()
  return tuple(f for f in ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg",
                           "jpeg", "tif", "tiff", "webp") if f in writes)


def check_figure_file(path: str, flag: str = "--output") -> None:
  """:func:`check_output_file`, and a suffix of :func:`figure_formats`.

  Raises:
    ValueError: one line saying what is wrong with ``path``.
  """
  check_output_file(path, flag)
  formats = figure_formats()
  if os.path.splitext(path)[1][1:].lower() not in formats:
    raise ValueError(f"{flag}={path}: name a file whose suffix is a format "
                     "matplotlib writes (." + ", .".join(formats) + ")")
