"""Fetching a dataset's official files, only when asked (``--data.download``).

:func:`fetch` puts on this machine the files the catalog lists for a
dataset (:attr:`~augfl_jax.data.catalog.DatasetSpec.remote`: the publisher's
URLs and mirrors, each file's size and SHA-256), unless
:func:`~augfl_jax.data.catalog.locate` finds its train and test splits
already. It stores them under ``--data.data_dir``, else
``$AUGFL_JAX_DATA_DIR``, else the user data directory
(:func:`~augfl_jax.data.catalog.user_data_dir`), each in its own
sub-directory (``mnist/``, ``emnist/gzip/``, ``cifar10/cifar-10-batches-bin/``),
where the next run finds them without any flag.

The transfer is pooch's (:func:`pooch.retrieve`: the known hash checked, a
file that differs deleted, the checked file moved into place, the archive
processors), with what it lacks added here:

* what is fetched, and its size, is printed first, then the progress;
* an interrupted transfer (a dropped connection, Ctrl-C) keeps what
  arrived in ``<name>.part`` and the next call continues it with an HTTP
  ``Range`` request; the whole file is hash-checked as pooch does;
* an archive is refused before anything is extracted if a member would land
  outside the directory (an absolute path, ``..``) or is not a regular file
  or a directory (a symbolic or hard link, a device, a FIFO); only the
  members the dataset reads are extracted, each into a temporary directory
  beside its place and renamed into it;
* one process fetches a file at a time (a lock beside it), so processes of
  one run, or runs started together, do not write the same file.

With ``form="tfds"`` the tfds prepared copy is made by tfds itself
(``tfds.builder(name, data_dir=...).download_and_prepare()``, its own
checksums), which needs the ``tfds`` extra. Every failure is one line
(:class:`DownloadError`).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import posixpath
import re
import shutil
import signal
import stat
import sys
import tarfile
import tempfile
import threading
from typing import Callable, Iterator
import urllib.parse
import zipfile
import zlib

import pooch

from augfl_jax.data import catalog
from augfl_jax.storage import locks

__all__ = ["DownloadError", "DownloadInterrupted", "FORMS", "fetch",
           "target_dir"]

FORMS = ("files", "tfds")  # --data.download_as
# Written as it arrives; a transfer cut short loses at most the chunk in
# flight (requests reads whole chunks).
_CHUNK = 1 << 16
_TIMEOUT_S = 60

Log = Callable[[str], None]


class DownloadError(catalog.DatasetUnavailableError):
  """A fetch failed or was refused (one line: what, why, what to do)."""


class DownloadInterrupted(DownloadError):
  """SIGINT or SIGTERM stopped a fetch; what arrived is kept for the next
  call. ``signum``: the signal."""

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.signum = signum


class _Incomplete(Exception):
  """The server sent less than the file (it closed the connection)."""


def _stderr(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def target_dir(data_dir: str | None = None) -> str:
  """Where :func:`fetch` stores a dataset: ``data_dir``, else
  ``$AUGFL_JAX_DATA_DIR``, else :func:`catalog.user_data_dir` (``~``
  expanded); each is searched by :func:`catalog.locate`."""
  return os.path.expanduser(data_dir or os.environ.get(catalog.ENV_VAR)
                            or catalog.user_data_dir())


def _unique(remote: tuple[catalog.RemoteFile, ...]
           ) -> list[catalog.RemoteFile]:
  return list({(r.directory, r.name): r for r in remote}.values())


def _in_place(remote: catalog.RemoteFile, root: str) -> bool:
  """Whether what ``remote`` provides is there: its extracted members (an
  archive), or the file itself."""
  directory = os.path.join(root, remote.directory)
  return all(os.path.isfile(os.path.join(directory, m))
             for m in remote.members or (remote.name,))


class _Progress:
  """The progress object pooch's downloader updates (``total``,
  ``update``, ``reset``, ``close``): on a terminal one line redrawn, else a
  line every 10%. Counts from ``start``, the bytes of a partial file."""

  def __init__(self, name: str, start: int, size: int):
    self.name, self.start, self.size = name, start, size
    self.done, self.total, self._shown, self._open = start, 0, -1, True
    self._tty = sys.stderr.isatty()

  def update(self, n: int) -> None:
    self.done = min(self.done + n, self.size)
    percent = int(100 * self.done / max(self.size, 1))
    if (percent > self._shown if self._tty
        else percent // 10 > self._shown // 10):
      line = (f"  {self.name}: {percent:3d}% ({catalog.size_text(self.done)}"
              f" of {catalog.size_text(self.size)})")
      if self._tty:
        print("\r" + line, end="", file=sys.stderr, flush=True)
      else:
        _stderr(line)
      self._shown = percent

  def reset(self) -> None:
    self.done = self.start

  def close(self) -> None:
    if self._open and self._tty:
      print(file=sys.stderr, flush=True)
    self._open = False


class _Resuming(pooch.HTTPDownloader):
  """pooch's HTTP downloader (requests), appending to ``<file>.part`` from
  where it ends (an HTTP ``Range`` request), then moving the whole file to
  pooch's temporary file, which pooch hash-checks and moves into place.
  A transfer that ends short raises :class:`_Incomplete`, keeping the
  partial file; one that goes past the size starts again."""

  def __init__(self, remote: catalog.RemoteFile, part: str):
    super().__init__(progressbar=False, chunk_size=_CHUNK,
                     timeout=_TIMEOUT_S)
    self.remote, self.part = remote, part

  def __call__(self, url, output_file, pooch_, check_only=False):
    if check_only:
      return super().__call__(url, output_file, pooch_, check_only=True)
    done = os.path.getsize(self.part) if os.path.exists(self.part) else 0
    if done > self.remote.size:
      os.remove(self.part)
      done = 0
    if done < self.remote.size:
      self._append(url, pooch_, done)
    done = os.path.getsize(self.part)
    if done != self.remote.size:
      raise _Incomplete(f"the server sent {catalog.size_text(done)} of "
                        f"{catalog.size_text(self.remote.size)}")
    os.replace(self.part, output_file)
    return None

  def _append(self, url, pooch_, done: int) -> None:
    progress = _Progress(self.remote.name, done, self.remote.size)
    with open(self.part, "ab") as f:
      def check_range(response, *args, **kwargs):
        """A server that ignores ``Range`` sends the whole file: start the
        partial file over; one that sends another range: refuse."""
        del args, kwargs
        if done and response.status_code == 200:
          f.seek(0)
          f.truncate()
          progress.start = progress.done = 0
        elif response.status_code == 206:
          sent = response.headers.get("Content-Range", "")
          if not sent.startswith(f"bytes {done}-"):
            raise _Incomplete(f"asked for bytes {done}- and got {sent!r}")
        return response

      self.kwargs["headers"] = {"Accept-Encoding": "identity",
                                **({"Range": f"bytes={done}-"} if done
                                   else {})}
      self.kwargs["hooks"] = {"response": check_range}
      self.progressbar = progress
      if done:
        _stderr(f"  {self.remote.name}: continuing from "
                f"{catalog.size_text(done)}")
      try:
        super().__call__(url, f, pooch_)
      finally:
        progress.close()
        if not f.tell():  # nothing came: no partial file
          os.remove(self.part)


def _outside(name: str) -> bool:
  """Whether an archive member's path leaves the extraction directory."""
  path = name.replace("\\", "/")
  return (path.startswith("/") or re.match(r"^[A-Za-z]:", path) is not None
          or ".." in posixpath.normpath(path).split("/"))


def _members(fname: str) -> list[tuple[str, str]]:
  """``(name, what)`` of every member of a zip or tar archive, ``what``
  ``"file"``, ``"directory"``, ``"symbolic link"``, ``"hard link"`` or
  ``"device or FIFO"``."""
  if fname.endswith(".zip"):
    with zipfile.ZipFile(fname) as z:
      out = []
      for info in z.infolist():
        kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no Unix type
        what = ("directory" if info.is_dir() or kind == stat.S_IFDIR else
                "symbolic link" if kind == stat.S_IFLNK else
                "file" if kind in (0, stat.S_IFREG) else "device or FIFO")
        out.append((info.filename, what))
      return out
  with tarfile.open(fname) as t:
    return [(m.name, "file" if m.isreg() else "directory" if m.isdir() else
             "symbolic link" if m.issym() else "hard link" if m.islnk() else
             "device or FIFO") for m in t.getmembers()]


class _Checked:
  """Mixed into pooch's ``Unzip`` and ``Untar``: the archive's members are
  checked before anything is extracted (:class:`DownloadError` naming the
  first that would land outside the directory or is not a regular file or
  a directory; a member the dataset reads that the archive lacks), then
  the members are extracted into a temporary directory beside their
  place and each renamed into it."""

  def _extract_file(self, fname, extract_dir):
    names = set()
    for name, what in _members(fname):
      if _outside(name) or what not in ("file", "directory"):
        where = ("a path outside the directory" if _outside(name)
                 else f"a {what}")
        raise DownloadError(
            f"--data.download: {os.path.basename(fname)} holds {name!r}, "
            f"{where}: refused, nothing was extracted and the archive is "
            "deleted")
      names.add(name)
    missing = [m for m in self.members if m not in names]
    if missing:
      raise DownloadError(
          f"--data.download: {os.path.basename(fname)} has no member "
          f"{missing[0]!r}: it is not the official archive; it is deleted")
    scratch = tempfile.mkdtemp(prefix=".extracting-", dir=extract_dir)
    try:
      super()._extract_file(fname, scratch)
      for member in self.members:
        dest = os.path.join(extract_dir, member)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(os.path.join(scratch, member), dest)
    finally:
      shutil.rmtree(scratch, ignore_errors=True)


class _Unzip(_Checked, pooch.Unzip):
  pass


class _Untar(_Checked, pooch.Untar):
  pass


@contextlib.contextmanager
def _signals_stop(what: Callable[[], str]) -> Iterator[None]:
  """SIGINT and SIGTERM raise :class:`DownloadInterrupted` at once in the
  block (main thread only), ``what()`` saying what was kept: a download
  takes minutes, and a run's own handlers would only note the signal."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def stop(signum, frame):
    del frame
    raise DownloadInterrupted(
        f"--data.download: {signal.Signals(signum).name}: {what()}", signum)

  old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for s, handler in old.items():
      signal.signal(s, handler)


def _kept(path: str) -> str:
  """What is kept of the file ``path`` (an archive not yet extracted, or
  a partial download), for messages."""
  part = path + ".part"
  if os.path.exists(path):
    return f"{path} is kept; the same command extracts it"
  if not os.path.exists(part) or not os.path.getsize(part):
    return "nothing was kept"
  return (f"{catalog.size_text(os.path.getsize(part))} kept in {part}; the "
          "same command continues it")


def _host(url: str) -> str:
  return urllib.parse.urlsplit(url).netloc


def _hash_error(url: str, error: ValueError) -> str:
  got = re.search(r"but got ([0-9a-fA-F]+)", str(error))
  return (f"{_host(url)}: SHA-256 {got.group(1)[:16] if got else '?'}..., "
          "not the catalog's (a corrupt or changed file), deleted")


def _fetch_file(remote: catalog.RemoteFile, root: str) -> None:
  """``remote`` into ``root/remote.directory``, one process at a time:
  downloaded (each URL in turn) unless there with the right hash, then its
  members extracted."""
  directory = os.path.join(root, remote.directory)
  os.makedirs(directory, exist_ok=True)
  said = []

  def busy(holder: str) -> None:
    if not said:
      _stderr(f"  {remote.name}: process {holder} is fetching it; waiting")
      said.append(holder)

  path = os.path.join(directory, remote.name)
  lock = os.path.join(directory, f".{remote.name}.lock")
  with _signals_stop(lambda: f"stopped fetching {remote.name}; "
                     f"{_kept(path)}"), locks.hold(lock, busy):
    try:
      if not _in_place(remote, root):  # else another process fetched it
        _download(remote, path)
        if remote.members:
          _extract(remote, path)
    finally:  # removed while held: a process waiting takes a new one
      os.remove(lock)


def _download(remote: catalog.RemoteFile, path: str) -> None:
  """``remote`` to ``path`` with pooch, from each of its URLs in turn until
  one gives the file with the right hash; pooch keeps a file already there
  with the right hash."""
  import requests  # pylint: disable=g-import-not-at-top  # pooch's, lazily

  reasons = []
  for url in remote.urls:
    try:
      pooch.retrieve(url, known_hash=f"sha256:{remote.sha256}",
                     fname=remote.name, path=os.path.dirname(path),
                     downloader=_Resuming(remote, path + ".part"))
      return
    except ValueError as e:  # pooch: the hash differs; the file is gone
      reasons.append(_hash_error(url, e))
    except (requests.RequestException, _Incomplete) as e:
      reasons.append(f"{_host(url)}: {_reason(e)}")
  raise DownloadError(
      f"--data.download: {remote.name} could not be fetched: "
      f"{'; '.join(reasons)}; {_kept(path)}")


def _extract(remote: catalog.RemoteFile, path: str) -> None:
  """The members of the archive at ``path`` beside it (pooch's processor,
  checked); a refused or unreadable archive is deleted."""
  extractor = (_Unzip if remote.name.endswith(".zip") else _Untar)(
      members=list(remote.members), extract_dir=".")
  try:
    extractor(path, "download", None)
  except DownloadInterrupted:
    raise
  except DownloadError:  # refused by the check
    os.remove(path)
    raise
  except (zipfile.BadZipFile, tarfile.TarError, gzip.BadGzipFile, EOFError,
          zlib.error) as e:
    os.remove(path)
    raise DownloadError(
        f"--data.download: {remote.name} cannot be read as an archive "
        f"({type(e).__name__}: {_reason(e)}): it is deleted, nothing was "
        "extracted") from None


def _reason(error: BaseException) -> str:
  """Why a transfer failed, in a few words (requests' nested reasons
  cut); any other error's first line, at most 160 characters."""
  import requests  # pylint: disable=g-import-not-at-top  # pooch's, lazily

  text = str(error).strip()
  if isinstance(error, requests.HTTPError) and error.response is not None:
    return f"HTTP {error.response.status_code} {error.response.reason}"
  if isinstance(error, requests.Timeout):
    return f"no answer in {_TIMEOUT_S} s"
  if isinstance(error, requests.exceptions.ChunkedEncodingError):
    return "the connection broke off"
  if isinstance(error, requests.ConnectionError):
    if re.search(r"NameResolution|Name or service|getaddrinfo|resolve",
                 text):
      return "host not found (no network?)"
    return ("connection refused" if "refused" in text else
            "the connection broke off" if "Connection broken" in text else
            "no connection")
  text = text.splitlines()[0] if text else type(error).__name__
  return text if len(text) <= 160 else text[:157] + "..."


def _prepare_tfds(spec: catalog.DatasetSpec, root: str, log: Log) -> None:
  """The tfds prepared copy of ``spec`` under ``root``, made by tfds."""
  if not spec.tfds_name:
    raise DownloadError(f"--data.download_as=tfds: {spec.name} has no tfds "
                        "form; use --data.download_as=files")
  missing = catalog.missing_tfds()
  if missing:
    raise DownloadError(
        f"--data.download_as=tfds prepares the copy with tfds "
        f"({', '.join(missing)} not installed): install the tfds extra, pip "
        "install -e \".[tfds]\", or use --data.download_as=files")
  from augfl_jax.data import sources  # pylint: disable=g-import-not-at-top
  tfds = sources.import_tfds()
  size = sum(r.size for r in _unique(spec.remote))
  log(f"--data.download: preparing the tfds copy of {spec.tfds_name} in "
      f"{root} through tfds"
      + (f" ({catalog.size_text(size)} to fetch)" if size else ""))
  try:
    tfds.builder(spec.tfds_name, data_dir=root).download_and_prepare()
  except Exception as e:  # pylint: disable=broad-except  # tfds's many
    raise DownloadError(f"--data.download_as=tfds: tfds could not prepare "
                        f"{spec.tfds_name} in {root}: {_reason(e)}") from None


def fetch(name: str, data_dir: str | None = None, *, form: str = "files",
          log: Log = _stderr) -> catalog.Location:
  """Puts a dataset's official files on this machine, unless they are
  there already, and returns where :func:`catalog.locate` then finds it.

  Args:
    name: a dataset name or alias.
    data_dir: ``--data.data_dir``; where to store them (default
      :func:`target_dir`).
    form: ``"files"``: the official files (IDX, CIFAR binary), extracted
      from their archive where they come in one; ``"tfds"``: a tfds
      prepared copy, prepared by tfds.
    log: takes the line saying what is fetched, its size and where to;
      the progress goes to stderr.

  Returns:
    The dataset's :class:`~augfl_jax.data.catalog.Location`.

  Raises:
    ValueError: an unknown dataset or ``form``.
    DownloadError: no official files known, a transfer that failed at
      every URL, a file whose SHA-256 differs from the catalog's, an
      archive refused or unreadable (one line each; nothing is left in
      place but a partial download, which the next call continues).
    DownloadInterrupted: SIGINT or SIGTERM during a transfer.
  """
  if form not in FORMS:
    raise ValueError(f"--data.download_as must be one of {', '.join(FORMS)},"
                     f" got {form!r}")
  spec = catalog.spec(name)
  if spec.embedded:
    return catalog.locate(spec.name)
  try:
    location = catalog.locate(spec.name, data_dir)
    if catalog.has_test_split(spec, location):
      return location
  except catalog.DatasetUnavailableError:
    pass
  root = target_dir(data_dir)
  os.makedirs(root, exist_ok=True)
  if form == "tfds":
    _prepare_tfds(spec, root, log)
    return catalog.locate(spec.name, data_dir)
  if not spec.remote:
    raise DownloadError(f"--data.download: augfl_jax knows no official files"
                        f" of {spec.name}; {catalog.remedy(spec)}")
  pending = [r for r in _unique(spec.remote) if not _in_place(r, root)]
  if pending:
    where = {os.path.join(root, r.directory) for r in pending}
    log(f"--data.download: fetching {spec.name} into "
        f"{where.pop() if len(where) == 1 else root}: "
        + ", ".join(f"{r.name} ({catalog.size_text(r.size)})"
                    for r in pending)
        + (f", {catalog.size_text(sum(r.size for r in pending))} in all"
           if len(pending) > 1 else "")
        + f", from {pending[0].urls[0].rpartition('/')[0]}/")
  quiet = pooch.get_logger().level
  pooch.get_logger().setLevel("WARNING")  # it would say so once more
  try:
    for remote in pending:
      _fetch_file(remote, root)
  finally:
    pooch.get_logger().setLevel(quiet)
  return catalog.locate(spec.name, data_dir)
