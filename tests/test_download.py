"""--data.download: the real fetching code against a local HTTP server.

The server (http.server in a thread, on 127.0.0.1) serves small files in the
official layouts (IDX files, NIST's zip, CIFAR's binary tarballs); the
catalog's URLs, sizes and SHA-256 are pointed at them. Every other address
is refused, so no test reaches the internet.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import http.server
import io
import os
import re
import signal
import socket
import stat
import tarfile
import threading
import time
import zipfile

import numpy as np
import pytest

from augfl_jax import data as D
from augfl_jax import training
from augfl_jax.data import catalog, download
from tests.test_cifar import cifar_records


class Server:
  """Files served on 127.0.0.1 (``files``: URL path -> bytes), honouring
  ``Range: bytes=N-``, with the faults a test sets: ``drop_after[path] =
  n`` sends n bytes of the next response and closes the connection,
  ``signal_after[path] = (n, signum)`` sends n bytes and signals this
  process, ``ignore_range`` answers every request with the whole file.
  ``requests`` records ``(path, Range header)`` of each GET."""

  def __init__(self):
    self.files, self.requests = {}, []
    self.drop_after, self.signal_after, self.ignore_range = {}, {}, False
    owner = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # pylint: disable=invalid-name
        owner.requests.append((self.path, self.headers.get("Range")))
        body = owner.files.get(self.path)
        if body is None:
          self.send_error(404)
          return
        start = 0
        asked = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if asked and not owner.ignore_range:
          start = int(asked.group(1))
          self.send_response(206)
          self.send_header("Content-Range",
                           f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
          self.send_response(200)
        payload = body[start:]
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
          if self.path in owner.drop_after:
            self.wfile.write(payload[:owner.drop_after.pop(self.path)])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
          if self.path in owner.signal_after:
            n, signum = owner.signal_after.pop(self.path)
            self.wfile.write(payload[:n])
            self.wfile.flush()
            time.sleep(0.5)  # the client writes what came
            os.kill(os.getpid(), signum)
            time.sleep(1.0)  # the client stops reading meanwhile
          self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
          pass

      def log_message(self, *args):  # quiet
        del args

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
    self.thread = threading.Thread(target=self.httpd.serve_forever,
                                   kwargs={"poll_interval": 0.05},
                                   daemon=True)
    self.thread.start()

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()


@pytest.fixture
def server(monkeypatch, tmp_path):
  """A local server; only it can be reached. The data directories are
  empty ones under ``tmp_path`` (the user data directory:
  ``tmp_path/xdg/augfl_jax``)."""
  connect = socket.socket.connect

  def local_only(sock, address):
    if isinstance(address, tuple) and address[0] not in ("127.0.0.1",
                                                         "localhost"):
      raise AssertionError(f"a test tried to reach {address}")
    return connect(sock, address)

  monkeypatch.setattr(socket.socket, "connect", local_only)
  for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY",
              "ALL_PROXY", "all_proxy"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.delenv(catalog.ENV_VAR, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  s = Server()
  yield s
  s.close()


def _sha256(payload: bytes) -> str:
  return hashlib.sha256(payload).hexdigest()


def serve(monkeypatch, server_: Server, name: str, files: dict[str, bytes],
          sha256: dict[str, str] | None = None) -> catalog.DatasetSpec:
  """Points ``name``'s catalog entry at ``files`` on the server (their
  sizes and SHA-256, or ``sha256``'s)."""
  spec = catalog.spec(name)
  remote = tuple(dataclasses.replace(
      r, urls=(f"{server_.url}/{r.name}",), size=len(files[r.name]),
      sha256=(sha256 or {}).get(r.name, _sha256(files[r.name])))
                 for r in spec.remote)
  spec = dataclasses.replace(spec, remote=remote)
  monkeypatch.setitem(catalog._REGISTRY, spec.name, spec)  # pylint: disable=protected-access
  server_.files.update({f"/{k}": v for k, v in files.items()})
  return spec


def _idx_gz(array: np.ndarray) -> bytes:
  """A gzipped IDX file of uint8 ``array``: 00 00 08 ndim, the sizes
  (big-endian uint32), the bytes."""
  out = io.BytesIO()
  with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as f:
    f.write(bytes([0, 0, 8, array.ndim]) +
            b"".join(int(d).to_bytes(4, "big") for d in array.shape) +
            array.astype(np.uint8).tobytes())
  return out.getvalue()


def _images(n: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (n, 28, 28), np.uint8)


def mnist_files(n_train: int = 30, n_test: int = 20, offset: int = 0,
                prefix: str = "") -> dict[str, bytes]:
  """The four gzipped IDX files of an MNIST-like dataset."""
  names = catalog.split_files(catalog.spec("mnist"), "train") + \
      catalog.split_files(catalog.spec("mnist"), "test")
  if prefix:  # emnist-<split>-{train,test}-...
    names = (f"{prefix}train-images-idx3-ubyte",
             f"{prefix}train-labels-idx1-ubyte",
             f"{prefix}test-images-idx3-ubyte",
             f"{prefix}test-labels-idx1-ubyte")
  arrays = (_images(n_train, 0), np.arange(n_train) % 10 + offset,
            _images(n_test, 1), np.arange(n_test) % 10 + offset)
  return {f"{name}.gz": _idx_gz(np.asarray(a, np.uint8))
          for name, a in zip(names, arrays)}


def emnist_zip(extra: dict[str, bytes] | None = None,
               links: dict[str, str] | None = None) -> bytes:
  """NIST's gzip.zip, small: gzip/emnist-letters-* (labels 1..26, as the
  real ones), another split's file and the mapping; ``extra`` members
  added as they are, ``links`` as symbolic links."""
  members = {f"gzip/{k}": v for k, v in mnist_files(
      52, 26, offset=1, prefix="emnist-letters-").items()}
  members["gzip/emnist-letters-mapping.txt"] = b"1 65 97\n"
  members["gzip/emnist-digits-train-labels-idx1-ubyte.gz"] = _idx_gz(
      np.zeros(3, np.uint8))
  members.update(extra or {})
  out = io.BytesIO()
  with zipfile.ZipFile(out, "w") as z:
    z.writestr(zipfile.ZipInfo("gzip/"), b"")
    for name, payload in members.items():
      z.writestr(name, payload)
    for name, target in (links or {}).items():
      info = zipfile.ZipInfo(name)
      info.external_attr = (stat.S_IFLNK | 0o777) << 16
      z.writestr(info, target)
  return out.getvalue()


def cifar_tar(name: str, extra: list[tarfile.TarInfo] | None = None,
              records: int = 4) -> bytes:
  """cifar-10-binary.tar.gz or cifar-100-binary.tar.gz, small (``records``
  a file), with its directory entry, a text file and ``extra`` members
  (links, devices, paths outside)."""
  spec = catalog.spec(name)
  folder = os.path.dirname(spec.remote[0].members[0])
  members = {}
  for i, f in enumerate(catalog.split_files(spec, "train") +
                        catalog.split_files(spec, "test")):
    members[f"{folder}/{f}"] = cifar_records(
        records, spec.cifar_label_bytes, spec.num_classes, i)[0]
  members[f"{folder}/readme.html"] = b"<html></html>"
  out = io.BytesIO()
  with tarfile.open(fileobj=out, mode="w:gz") as t:
    directory = tarfile.TarInfo(folder)
    directory.type = tarfile.DIRTYPE
    t.addfile(directory)
    for member, payload in members.items():
      info = tarfile.TarInfo(member)
      info.size = len(payload)
      t.addfile(info, io.BytesIO(payload))
    for info in extra or []:
      t.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
  return out.getvalue()


def _files_under(root) -> list[str]:
  return sorted(os.path.relpath(os.path.join(d, f), root)
                for d, _, files in os.walk(root) for f in files)


def _user_dir(tmp_path) -> str:
  return str(tmp_path / "xdg" / "augfl_jax")


# --- the official layouts: fetched, found by the next run without flags ---

@pytest.mark.parametrize("name, kind, archive", [
    ("mnist", "idx", None),
    ("emnist", "idx", "gzip.zip"),
    ("cifar10", "cifar", "cifar-10-binary.tar.gz"),
    ("cifar100", "cifar", "cifar-100-binary.tar.gz")])
def test_fetch_lands_where_the_next_run_finds_it(server, monkeypatch,
                                                  tmp_path, capsys, name,
                                                  kind, archive):
  files = ({"gzip.zip": emnist_zip()} if name == "emnist" else
           {archive: cifar_tar(name)} if archive else mnist_files())
  spec = serve(monkeypatch, server, name, files)
  with pytest.raises(D.DatasetUnavailableError, match="--data.download"):
    D.locate(name)
  location = D.fetch(name)
  said = capsys.readouterr().err
  first = said.splitlines()[0]
  assert first.startswith(f"--data.download: fetching {spec.name} into "
                          f"{_user_dir(tmp_path)}")
  for r in spec.remote:  # what and how much, before the progress
    assert f"{r.name} ({catalog.size_text(r.size)})" in first
  assert "100%" in said
  # Found again without any flag, train and test, and read.
  assert D.locate(name) == location and location.kind == kind
  assert location.path.startswith(_user_dir(tmp_path))
  assert catalog.has_test_split(spec, location)
  dataset = D.load_dataset(name)
  test = D.load_split(name, D.locate_test_split(name, location), "test",
                      like=dataset)
  assert dataset.num_classes == spec.num_classes
  assert dataset.x.shape[1:] == spec.example_shape
  assert test.num_examples > 0 and dataset.y.min() >= 0
  kept = _files_under(_user_dir(tmp_path))
  if archive:  # only the members read are extracted, beside the archive
    assert sorted(kept) == sorted(
        [os.path.join(spec.remote[0].directory, archive)] +
        [os.path.join(spec.remote[0].directory, m)
         for m in spec.remote[0].members])
  else:
    assert sorted(kept) == sorted(os.path.join("mnist", f) for f in files)
  # A second call fetches nothing.
  asked = len(server.requests)
  assert D.fetch(name) == location
  assert len(server.requests) == asked and not capsys.readouterr().err


def test_a_complete_copy_is_fetched_beside_train_files_alone(
    server, monkeypatch, tmp_path):
  files = mnist_files()
  serve(monkeypatch, server, "mnist", files)
  given = tmp_path / "given"  # the train files alone, as README once said
  given.mkdir()
  for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
    (given / f).write_bytes(files[f])
  location = D.locate("mnist", str(given))
  assert location.path == str(given)
  with pytest.raises(D.OfficialTestSplitUnavailable,
                     match="--data.download fetches them"):
    D.locate_test_split("mnist", location)
  location = D.fetch("mnist", str(given))
  assert location.path == str(given / "mnist")  # preferred: it has both
  assert D.locate("mnist", str(given)) == location
  assert catalog.has_test_split(catalog.spec("mnist"), location)


def test_the_run_fetches_only_with_the_flag(server, monkeypatch, tmp_path):
  serve(monkeypatch, server, "mnist", mnist_files())
  config = training.RunConfig(algorithm="fedavg", dataset="mnist")
  with pytest.raises(D.DatasetUnavailableError) as err:
    training.prepare(config)  # off by default: nothing is fetched
  assert not server.requests and "--data.download" in str(err.value)
  data_dir = tmp_path / "given"
  plan = training.prepare(training.config.fields.replace(
      config, **{"data.download": True, "data.data_dir": str(data_dir)}))
  assert plan.location.path == str(data_dir / "mnist")
  assert len(server.requests) == 4
  # The next run finds them with --data.data_dir alone, and fetches nothing.
  again = training.prepare(training.config.fields.replace(
      config, **{"data.data_dir": str(data_dir)}))
  assert again.location == plan.location and len(server.requests) == 4


# --- refused: one line, nothing left in place ---

@pytest.mark.parametrize("fault", ["corrupt in transit", "wrong checksum"])
def test_a_file_with_another_hash_is_refused(server, monkeypatch, tmp_path,
                                             fault):
  files = mnist_files()
  name = "t10k-labels-idx1-ubyte.gz"  # the last one fetched
  if fault == "corrupt in transit":
    serve(monkeypatch, server, "mnist", files)
    served = bytearray(files[name])
    served[len(served) // 2] ^= 0xFF
    server.files["/" + name] = bytes(served)
  else:
    serve(monkeypatch, server, "mnist", files, sha256={name: "ab" * 32})
  with pytest.raises(download.DownloadError) as err:
    D.fetch("mnist")
  message = str(err.value)
  assert "\n" not in message and len(message) < 400, message
  assert message.startswith(f"--data.download: {name} could not be fetched")
  assert "SHA-256" in message and "nothing was kept" in message
  # The files before it landed; nothing of it is left, and no partial file
  # or lock.
  kept = _files_under(_user_dir(tmp_path))
  assert kept == sorted("mnist/" + n for n in files if n != name)


def test_a_corrupt_archive_is_refused(server, monkeypatch, tmp_path):
  broken = emnist_zip()[:-300]  # its central directory cut off
  serve(monkeypatch, server, "emnist", {"gzip.zip": broken})
  with pytest.raises(download.DownloadError) as err:
    D.fetch("emnist")
  message = str(err.value)
  assert "\n" not in message
  assert "gzip.zip cannot be read as an archive" in message
  assert _files_under(tmp_path / "xdg") == []


# --- interrupted: the next call continues from the partial file ---

@pytest.mark.parametrize("fault", ["dropped connection", "truncated file"])
def test_an_interrupted_download_continues(server, monkeypatch, tmp_path,
                                           fault):
  archive = cifar_tar("cifar10", records=40)  # 740 kB
  spec = serve(monkeypatch, server, "cifar10",
               {"cifar-10-binary.tar.gz": archive})
  path = "/cifar-10-binary.tar.gz"
  cut = 2 * len(archive) // 3
  if fault == "dropped connection":
    server.drop_after[path] = cut
  else:  # the server's copy ends early, its Content-Length with it
    server.files[path] = archive[:cut]
  with pytest.raises(download.DownloadError) as err:
    D.fetch("cifar10")
  part = os.path.join(_user_dir(tmp_path), "cifar10",
                      "cifar-10-binary.tar.gz.part")
  assert "\n" not in str(err.value)
  assert f"kept in {part}; the same command continues it" in str(err.value)
  kept = os.path.getsize(part)  # what arrived, less the chunk in flight
  assert 0 < kept <= cut
  server.files[path] = archive
  location = D.fetch("cifar10")
  assert server.requests[-1] == (path, f"bytes={kept}-")
  assert not os.path.exists(part)
  archive_path = os.path.join(_user_dir(tmp_path), "cifar10",
                              "cifar-10-binary.tar.gz")
  with open(archive_path, "rb") as f:
    assert _sha256(f.read()) == spec.remote[0].sha256
  assert location.kind == "cifar" and len(location.files) == 5


def test_a_server_that_ignores_range_starts_over(server, monkeypatch,
                                                 tmp_path):
  files = mnist_files(n_train=600)
  serve(monkeypatch, server, "mnist", files)
  name = "train-images-idx3-ubyte.gz"
  server.drop_after["/" + name] = 1000
  with pytest.raises(download.DownloadError):
    D.fetch("mnist")
  server.ignore_range = True
  D.fetch("mnist")
  path = os.path.join(_user_dir(tmp_path), "mnist", name)
  with open(path, "rb") as f:
    assert f.read() == files[name]


def test_a_signal_stops_the_download_and_keeps_what_arrived(
    server, monkeypatch, tmp_path):
  files = mnist_files(n_train=2000)  # about 1.5 MB of images
  serve(monkeypatch, server, "mnist", files)
  name = "train-images-idx3-ubyte.gz"
  server.signal_after["/" + name] = (200_000, signal.SIGINT)
  config = training.config.fields.replace(
      training.RunConfig(algorithm="fedavg", dataset="mnist"),
      **{"data.download": True})
  before = signal.getsignal(signal.SIGINT)  # whatever the worker had
  with pytest.raises(training.RunInterrupted) as err:
    training.prepare(config)
  assert err.value.signum == signal.SIGINT and err.value.checkpoint is None
  part = os.path.join(_user_dir(tmp_path), "mnist", name + ".part")
  assert str(err.value).startswith(f"--data.download: SIGINT: stopped "
                                   f"fetching {name}; ")
  assert f"kept in {part}" in str(err.value)
  kept = os.path.getsize(part)
  assert 0 < kept < len(files[name])
  assert signal.getsignal(signal.SIGINT) is before  # given back
  D.fetch("mnist")
  assert (("/" + name, f"bytes={kept}-") in server.requests)


# --- archives that would write outside their directory ---

def _tar_member(name: str, kind: str) -> tarfile.TarInfo:
  info = tarfile.TarInfo(name)
  if kind == "symlink":
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
  elif kind == "hardlink":
    info.type, info.linkname = tarfile.LNKTYPE, "/etc/passwd"
  elif kind == "device":
    info.type = tarfile.CHRTYPE
  else:
    info.size = 4
  return info


@pytest.mark.parametrize("case", [
    "zip ../evil", "zip absolute", "zip symlink", "tar ../evil",
    "tar absolute", "tar symlink", "tar hardlink", "tar device"])
def test_an_archive_member_outside_or_a_link_is_refused(
    server, monkeypatch, tmp_path, case):
  form, what = case.split(" ", 1)
  evil = {"../evil": "../../../evil", "absolute": str(tmp_path / "evil"),
          "symlink": "cifar-10-batches-bin/data_batch_1.bin",
          "hardlink": "cifar-10-batches-bin/data_batch_1.bin",
          "device": "cifar-10-batches-bin/dev"}[what]
  if form == "zip":
    name, archive = "gzip.zip", emnist_zip(
        extra={evil: b"evil"} if what != "symlink" else None,
        links={"gzip/evil": "/etc/passwd"} if what == "symlink" else None)
    dataset = "emnist"
  elif what in ("symlink", "hardlink"):  # a link for a member read
    name, dataset = "cifar-10-binary.tar.gz", "cifar10"
    archive = _replace_member_with_link(cifar_tar(dataset), evil, what)
  else:
    name, dataset = "cifar-10-binary.tar.gz", "cifar10"
    archive = cifar_tar(dataset, extra=[_tar_member(
        evil, "device" if what == "device" else "file")])
  serve(monkeypatch, server, dataset, {name: archive})
  with pytest.raises(download.DownloadError) as err:
    D.fetch(dataset)
  message = str(err.value)
  assert "\n" not in message and "refused" in message, message
  assert "nothing was extracted" in message
  assert not os.path.lexists(tmp_path / "evil")
  assert not os.path.lexists(tmp_path / "xdg" / "evil")
  assert _files_under(tmp_path / "xdg") == []  # the archive deleted too


def _replace_member_with_link(archive: bytes, name: str, kind: str) -> bytes:
  """The tar ``archive`` with its member ``name`` a symbolic or hard link
  (to /etc/passwd) instead of a file."""
  out = io.BytesIO()
  with tarfile.open(fileobj=io.BytesIO(archive)) as src, \
      tarfile.open(fileobj=out, mode="w:gz") as dst:
    for info in src.getmembers():
      if info.name == name:
        dst.addfile(_tar_member(name, kind))
      elif info.isreg():
        dst.addfile(info, src.extractfile(info))
      else:
        dst.addfile(info)
  return out.getvalue()


# --- the tfds form, the catalog and the message without files ---

def test_the_tfds_form_is_prepared_by_tfds(server, monkeypatch, tmp_path,
                                           capsys):
  from augfl_jax.data import sources  # pylint: disable=g-import-not-at-top
  from tests.test_data import fake_tfds_copy  # pylint: disable=g-import-not-at-top
  calls = []

  class Builder:

    def __init__(self, name, data_dir):
      calls.append((name, data_dir))
      self.name, self.data_dir = name, data_dir

    def download_and_prepare(self):
      fake_tfds_copy(self.data_dir, self.name)
      version = os.path.join(self.data_dir, self.name, "1.0.0")
      open(os.path.join(version, "mnist-test.tfrecord-00000-of-00001"),
           "w").close()

  class FakeTfds:
    builder = Builder

  monkeypatch.setattr(catalog, "missing_tfds", lambda: [])
  monkeypatch.setattr(sources, "import_tfds", lambda: FakeTfds)
  location = D.fetch("mnist", form="tfds")
  assert calls == [("mnist", _user_dir(tmp_path))]
  assert location == D.Location("tfds", _user_dir(tmp_path))
  assert "preparing the tfds copy of mnist" in capsys.readouterr().err
  assert not server.requests


def test_every_official_file_is_in_the_catalog_where_locate_looks():
  for name in ("mnist", "fashion_mnist", "kmnist", "emnist/letters",
               "emnist/balanced", "cifar10", "cifar100"):
    spec = catalog.spec(name)
    assert spec.remote, name
    extracted = set()
    for r in spec.remote:
      assert re.fullmatch(r"[0-9a-f]{64}", r.sha256) and r.size > 0
      assert all(u.startswith(("http://", "https://")) and
                 u.endswith("/" + r.name) for u in r.urls)
      assert r.name.endswith((".gz", ".zip", ".tar.gz"))
      for f in r.members or (r.name,):
        directory, base = os.path.split(os.path.join(r.directory, f))
        assert directory in spec.subdirs, (name, directory)
        extracted.add(base)
    wanted = (catalog.split_files(spec, "train") +
              catalog.split_files(spec, "test"))
    assert all(w in extracted or w + ".gz" in extracted for w in wanted)
  # The binary versions, never CIFAR's pickled ones.
  assert not any("python" in r.name or "python" in u
                 for n in ("cifar10", "cifar100")
                 for r in catalog.spec(n).remote for u in r.urls)


def test_without_files_one_line_names_the_flags_and_every_file(server):
  del server  # for its empty directories
  for name, files in (
      ("emnist", ["emnist-letters-train-images-idx3-ubyte",
                  "emnist-letters-train-labels-idx1-ubyte",
                  "emnist-letters-test-images-idx3-ubyte",
                  "emnist-letters-test-labels-idx1-ubyte"]),
      ("mnist", ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]),
      ("cifar10", [f"data_batch_{i}.bin" for i in range(1, 6)] +
       ["test_batch.bin"]),
      ("cifar100", ["train.bin", "test.bin"])):
    with pytest.raises(D.DatasetUnavailableError) as err:
      D.locate(name)
    message = str(err.value)
    after_the_places = message.partition(": ")[2]
    assert "\n" not in message and len(after_the_places) < 360, message
    for part in files + ["--data.download", "--data.data_dir=DIR"]:
      assert part in message, (part, message)
