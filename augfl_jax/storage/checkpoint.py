"""Atomic save / restore of one pytree plus a JSON metadata dict (orbax).

A checkpoint is a directory with two orbax items, written by one synchronous
``ocp.Checkpointer(ocp.CompositeCheckpointHandler())``:

* ``state``: the pytree (``ocp.args.StandardSave``; arrays, numpy/Python
  scalars);
* ``metadata``: a JSON-serialisable dict (``ocp.args.JsonSave``).

Atomicity: on a local filesystem orbax writes everything into the sibling
``<directory>.orbax-checkpoint-tmp`` and only then renames it to
``<directory>`` (``orbax.checkpoint.path.atomicity.AtomicRenameTemporaryPath``,
its default for non-GCS paths; on GCS it writes a ``commit_success.txt``
marker instead). A crash mid-save therefore leaves no ``<directory>``, only a
stale temporary directory that the next save to that path removes.
Replacing an existing checkpoint (``overwrite=True``) keeps that guarantee
by saving to a fresh sibling first and swapping directories by renames (orbax's
own ``force=True`` would delete the old checkpoint before writing the new).

PRNG keys: typed key arrays (``jax.random.key``, any impl) are supported by
orbax 0.12 as they are: they are stored as their ``jax.random.key_data``
(``uint32``) and re-wrapped (``jax.random.wrap_key_data`` with the saved impl)
on restore, with or without ``like``. Legacy raw ``uint32`` keys
(``jax.random.PRNGKey``) are ordinary arrays.

Restoring without ``like`` gives the saved structure built from dicts and
lists (custom pytree nodes such as ``flax.struct`` dataclasses become dicts),
each leaf of the type it was saved as (``jax.Array``, numpy array, Python
scalar); pass ``like`` (a tree of arrays or ``jax.ShapeDtypeStruct``) to get
its structure, with shapes checked against it and values cast to its dtypes
(``jax.Array`` leaves where ``like`` has ``jax.Array`` or
``ShapeDtypeStruct`` leaves, numpy where it has numpy).

Verified: :func:`save` records a CRC-32 of every array of the tree in the
metadata, and seals the metadata (those checksums included) with a SHA-256
of its canonical JSON (:func:`seal`); :func:`restore` and
:func:`restore_metadata` check them and raise
:class:`DamagedCheckpointError` naming the first differing array (a flipped
bit, an edited value) or the metadata. The seal is derived from the content
alone, with no key: it catches accidental damage and any edit that does not
also recompute it, but it is no signature (whoever recomputes the SHA-256
of an edited metadata passes it). A keyed digest would need the same key
on every machine a run is copied to; a per-machine key would refuse every
copied run. A checkpoint sealed by an earlier version (a CRC-32 of its
metadata, :data:`OLD_SEAL`) is checked by that rule (:func:`check_seal`
says which seal it carries); one saved before the checksums were kept
reads back unchecked (:func:`has_checksums` says which), while one that
holds checksums but no seal (the seal removed) is damaged. The returned
metadata never holds the checksums or the seal.

A run's numbered checkpoints (its state every N rounds, the newest two kept,
verified on restore) are :mod:`augfl_jax.training.checkpoints`, on orbax's
``CheckpointManager``; this module keeps single checkpoints such as a PM's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import uuid
import zlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

__all__ = ["DamagedCheckpointError", "checksums", "exists", "has_checksums",
           "quiet_closed_loop_callbacks", "restore", "restore_metadata",
           "restore_target", "save", "seal", "check_seal", "check_checksums",
           "damage", "failure_reason", "seal_of", "seal_note"]

_STATE = "state"
_METADATA = "metadata"
# Metadata keys of the checks: a CRC-32 per array, and the metadata's seal
# (a SHA-256; an earlier version's, a CRC-32).
CHECKSUMS = "checksums"
SEAL = "metadata_sha256"
OLD_SEAL = "metadata_crc32"
SEALS = (SEAL, OLD_SEAL)


class DamagedCheckpointError(ValueError):
  """A checkpoint reads back, but an array or its metadata differs from what
  was saved (a checksum mismatch: a flipped bit, an edited value), or a
  file of it cannot be read (cut short, missing or corrupt)."""


def _local_bytes(leaf: Any) -> bytes:
  """The bytes of ``leaf`` that this process holds: all of them, except
  for a global array split over several processes (``jax.distributed``),
  whose own rows (its addressable shards, in index order) they are."""
  if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(
      leaf.dtype, jax.dtypes.prng_key):
    leaf = jax.random.key_data(leaf)
  if (isinstance(leaf, jax.Array) and not leaf.is_fully_addressable
      and not leaf.is_fully_replicated):
    shards = {tuple(s.indices(n)[:2] for s, n in zip(shard.index,
                                                      leaf.shape)): shard
              for shard in leaf.addressable_shards}
    return b"".join(np.ascontiguousarray(shards[k].data).tobytes()
                    for k in sorted(shards))
  if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
    leaf = leaf.addressable_data(0)
  return np.ascontiguousarray(jax.device_get(leaf)).tobytes()


def checksums(tree: Any) -> dict[str, int]:
  """``{leaf path: CRC-32 of its bytes}`` (typed PRNG keys by their data);
  for a global array split over processes, of this process's rows."""
  return {jax.tree_util.keystr(path): zlib.crc32(_local_bytes(leaf))
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_checksums(tree: Any, saved: Mapping[str, int | list[int]],
                    where: str, process: int = 0) -> None:
  """Raises :class:`DamagedCheckpointError` naming the leaves of ``tree``
  whose :func:`checksums` differ from ``saved``. A list in ``saved`` holds
  one checksum per process of a run across processes; ``process``'s is
  compared."""
  # Attribute keys as dict keys: restored without ``like``, a custom node
  # (a flax dataclass) comes back as a dict of its fields.
  normal = lambda k: re.sub(r"\.(\w+)", r"['\1']", k)
  saved = {normal(k): v[process] if isinstance(v, list) else v
           for k, v in saved.items()}
  bad = [k for k, v in checksums(tree).items() if saved.get(normal(k)) != v]
  if bad:
    raise DamagedCheckpointError(
        f"checksum mismatch in {', '.join(bad[:3])}"
        + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        + f" of {where}")


def _body(metadata: Mapping[str, Any]) -> bytes:
  """The canonical JSON of ``metadata`` without its seal."""
  body = {k: v for k, v in metadata.items() if k not in SEALS}
  return json.dumps(body, sort_keys=True).encode()


def _sha256(metadata: Mapping[str, Any]) -> str:
  return hashlib.sha256(_body(metadata)).hexdigest()


def _crc(metadata: Mapping[str, Any]) -> int:
  """An earlier version's seal: the CRC-32 of the same canonical JSON."""
  return zlib.crc32(_body(metadata))


def seal(metadata: Mapping[str, Any]) -> dict[str, Any]:
  """``metadata`` as it reads back from JSON, with the SHA-256 (hex) of
  its canonical JSON under :data:`SEAL`.

  Raises:
    TypeError: ``metadata`` is not JSON-serialisable.
  """
  metadata = json.loads(json.dumps(
      {k: v for k, v in metadata.items() if k not in SEALS}))
  return {**metadata, SEAL: _sha256(metadata)}


def seal_of(metadata: Mapping[str, Any]) -> str | None:
  """The key of the seal ``metadata`` carries (:data:`SEAL`, or an
  earlier version's :data:`OLD_SEAL`), ``None`` without one."""
  return next((key for key in SEALS if key in metadata), None)


def check_seal(metadata: Mapping[str, Any], where: str) -> str | None:
  """Checks the seal of ``metadata`` (:func:`seal`; an earlier version's
  CRC-32 by its own rule) and returns its key (:func:`seal_of`; ``None``:
  unsealed, which the caller judges); raises
  :class:`DamagedCheckpointError` when the seal does not match."""
  key = seal_of(metadata)
  if key is None:
    return None
  if metadata[key] != (_sha256(metadata) if key == SEAL
                       else _crc(metadata)):
    raise DamagedCheckpointError(
        f"the metadata of {where} does not match its checksum: edited or "
        "corrupted")
  return key


def quiet_closed_loop_callbacks() -> None:
  """Drops what orbax leaves to ``sys.unraisablehook`` when it has given
  up on a damaged or unwritable checkpoint, after the error itself was
  raised and reported: the ``RuntimeError('Event loop is closed')`` of
  TensorStore's callbacks, and the error of each of its reads still in
  flight, raised again as the read is closed (a traceback of dozens of
  lines per array); every other unraisable exception goes to the hook
  installed before."""
  previous = sys.unraisablehook
  if getattr(previous, "_augfl_jax_filter", False):
    return

  def hook(unraisable):
    if (isinstance(unraisable.exc_value, RuntimeError) and
        str(unraisable.exc_value) == "Event loop is closed"):
      return
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine's
    if code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename:
      return
    previous(unraisable)
  hook._augfl_jax_filter = True  # pylint: disable=protected-access
  sys.unraisablehook = hook


def _checkpointer() -> ocp.Checkpointer:
  return ocp.Checkpointer(ocp.CompositeCheckpointHandler())


def _abspath(directory: str | os.PathLike) -> str:
  # orbax needs absolute paths; expand "~" for the command line's sake.
  return os.path.abspath(os.path.expanduser(os.fspath(directory)))


def exists(directory: str | os.PathLike) -> bool:
  """Whether ``directory`` exists (finalised checkpoints only ever do)."""
  return os.path.exists(_abspath(directory))


def save(directory: str | os.PathLike, tree: Any,
         metadata: Mapping[str, Any], *, overwrite: bool = False) -> None:
  """Saves ``tree`` and ``metadata`` atomically to ``directory``.

  Args:
    directory: the checkpoint directory (its parent is created if needed).
    tree: a pytree of arrays / scalars (typed PRNG keys allowed).
    metadata: a JSON-serialisable mapping (tuples come back as lists);
      the checksums of ``tree`` and of itself are added.
    overwrite: replace an existing checkpoint at ``directory``; the old one
      stays readable until the new one is complete.

  Raises:
    FileExistsError: ``directory`` exists and ``overwrite`` is False.
    TypeError: ``metadata`` is not JSON-serialisable.
  """
  path = _abspath(directory)
  metadata = seal({**metadata, CHECKSUMS: checksums(tree)})  # may raise
  if os.path.exists(path) and not overwrite:
    raise FileExistsError(
        f"{path} already exists; pass overwrite=True to replace it.")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  target = path
  if os.path.exists(path):
    target = f"{path}.new-{uuid.uuid4().hex[:8]}"
  args = ocp.args.Composite(**{_STATE: ocp.args.StandardSave(tree),
                               _METADATA: ocp.args.JsonSave(metadata)})
  _checkpointer().save(target, args=args)
  if target != path:  # Swap in the complete new checkpoint.
    old = f"{path}.old-{uuid.uuid4().hex[:8]}"
    os.rename(path, old)
    os.rename(target, path)
    shutil.rmtree(old, ignore_errors=True)


# TensorStore's words for an array it could not read: a status code, the
# array's key ("params.fc1.kernel/0.0") and the files it read.
_TENSORSTORE_READ = re.compile(r'\b([A-Z_]{4,}): .*?Error reading "([^"/]+)/')
_TENSORSTORE_FILE = re.compile(r'local file "([^"]+)"')
# orbax's words for an item (a sub-directory) that is not there, and the
# items that are (none: no checkpoint at all).
_MISSING_ITEM = re.compile(r'Item "(\w+)" was not found in the checkpoint\. '
                           r'Available items: \[([^\]]*)\]')
_STATUS_WORDS = {"OUT_OF_RANGE": "cut short", "NOT_FOUND": "missing",
                 "DATA_LOSS": "corrupt", "FAILED_PRECONDITION": "corrupt"}


def _causes(error: BaseException):
  """``error`` and the exceptions it was raised from, outermost first."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def _torn_json(directory: str) -> str | None:
  """The first file under ``directory`` of orbax's JSON files (its
  metadata and the items' ``metadata``, ``_METADATA``, ...; not the arrays'
  files) that does not parse, or ``None``."""
  for root, dirs, names in sorted(os.walk(directory)):
    dirs[:] = [d for d in dirs if d != "d"]  # the arrays' data files
    for name in sorted(names):
      path = os.path.join(root, name)
      if name.endswith((".ocdbt", ".txt")):
        continue
      try:
        with open(path, encoding="utf-8") as f:
          json.load(f)
      except (OSError, ValueError):
        return path
  return None


def damage(error: BaseException, directory: str | None = None
          ) -> str | None:
  """What ``error`` (orbax's, reading the checkpoint at ``directory``) says
  is wrong with the checkpoint's files, in plain words ("the file of array
  ['params']['fc1']['kernel'] under .../state is cut short"), or ``None``
  when it does not say that a file is cut short, missing or corrupt. A
  JSON file that does not parse is named when ``directory`` is given."""
  for e in _causes(error):
    match = _TENSORSTORE_READ.search(str(e))
    if match:
      status, key = match.groups()
      what = _STATUS_WORDS.get(status, "damaged")
      files = _TENSORSTORE_FILE.findall(str(e))
      if files and not files[-1].endswith("/"):
        return f"{files[-1]} is {what}"
      array = "".join(f"[{part!r}]" for part in key.split("."))
      under = f" under {files[-1].rstrip('/')}" if files else ""
      return f"the file of array {array}{under} is {what}"
    if isinstance(e, json.JSONDecodeError):
      torn = _torn_json(directory) if directory else None
      return f"{torn or 'a JSON file of it'} is cut short or corrupt"
    match = _MISSING_ITEM.search(str(e)) if isinstance(e, KeyError) else None
    if match and match.group(2):
      return f"its directory {match.group(1)} is missing"
  return None


def failure_reason(error: BaseException, directory: str | None = None
                  ) -> str:
  """One line for why orbax could not read or write the checkpoint at
  ``directory``, without its internals: :func:`damage`'s words, else the
  first line of the message without TensorStore's spec, at most 200
  characters."""
  plain = damage(error, directory)
  if plain is not None:
    return plain
  text = str(error).split(" See full TensorStore details")[0].strip()
  return text.splitlines()[0][:200] if text else type(error).__name__


def _unreadable(path: str, error: BaseException) -> Exception:
  """The error for a checkpoint at ``path`` that orbax could not read:
  :class:`DamagedCheckpointError` where ``error`` says a file of it is
  cut short, missing or corrupt, else ``FileNotFoundError`` (no
  checkpoint there)."""
  plain = damage(error, path)
  if plain is not None:
    return DamagedCheckpointError(f"in the checkpoint at {path}, {plain}")
  return FileNotFoundError(
      f"No readable checkpoint at {path} ({type(error).__name__}: "
      f"{failure_reason(error)})")


def _read_metadata(path: str) -> dict[str, Any]:
  """The metadata item as saved (with its checks), its seal checked."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"No checkpoint at {path}")
  try:
    restored = _checkpointer().restore(
        path, args=ocp.args.Composite(**{_METADATA: ocp.args.JsonRestore()}))
    metadata = restored[_METADATA]
  except Exception as e:  # pylint: disable=broad-except
    raise _unreadable(path, e) from e
  if not isinstance(metadata, dict):
    raise FileNotFoundError(
        f"No readable checkpoint at {path} (its metadata is not a dict)")
  if (check_seal(metadata, f"the checkpoint at {path}") is None
      and CHECKSUMS in metadata):
    raise DamagedCheckpointError(
        f"the metadata of the checkpoint at {path} holds checksums but no "
        "seal: edited (checksums and seal are saved together)")
  return metadata


def seal_note(directory: str | os.PathLike) -> str:
  """What a log says of the checks of the checkpoint at ``directory`` when
  they are not this version's: ``""`` for a SHA-256 seal, else which older
  rule it was checked by, or that it is not verified; raises as
  :func:`restore_metadata`."""
  metadata = _read_metadata(_abspath(directory))
  if seal_of(metadata) == OLD_SEAL:
    return ("sealed by an older version (a CRC-32 of its metadata, checked "
            "by that rule)")
  if CHECKSUMS not in metadata:
    return "saved without checksums by an older version: not verified"
  return ""


def has_checksums(directory: str | os.PathLike) -> bool:
  """Whether the checkpoint at ``directory`` was saved with checksums (is
  verified on restore); raises as :func:`restore_metadata`."""
  return CHECKSUMS in _read_metadata(_abspath(directory))


def restore_metadata(directory: str | os.PathLike) -> dict[str, Any]:
  """Reads only the metadata dict (no arrays) of the checkpoint at
  ``directory``, its checksum checked.

  Raises:
    FileNotFoundError: ``directory`` is missing or not a readable checkpoint;
      the message names the path.
    DamagedCheckpointError: the metadata differs from what was saved, or
      its file is cut short or corrupt.
  """
  metadata = _read_metadata(_abspath(directory))
  return {k: v for k, v in metadata.items() if k not in (CHECKSUMS, *SEALS)}


def restore_target(like: Any) -> Any:
  """``like`` as an orbax restore target on this process's first device.

  Orbax restores a ``jax.ShapeDtypeStruct`` leaf with no sharding onto the
  devices it was saved from, and refuses ("Topology mismatch detected") where
  they are not here: a checkpoint saved on a GPU read on a CPU, or the other
  way. Such leaves get the default device's sharding; leaves with a
  sharding, arrays, numpy arrays and Python scalars are left as they are.
  """
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

  def leaf(x):
    if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None:
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
    return x

  return jax.tree.map(leaf, like)


def restore(directory: str | os.PathLike,
            like: Any = None) -> tuple[Any, dict[str, Any]]:
  """Restores ``(tree, metadata)`` saved by :func:`save`, verified.

  Args:
    directory: the checkpoint directory.
    like: optional pytree of arrays or ``jax.ShapeDtypeStruct`` giving the
      structure, shapes and dtypes to restore into (see the module docstring);
      with it, a checkpoint saved on other devices restores onto this
      process's (:func:`restore_target`).

  Returns:
    ``(tree, metadata)``.

  Raises:
    FileNotFoundError: ``directory`` is missing or not a readable checkpoint;
      the message names the path.
    DamagedCheckpointError: an array or the metadata differs from what was
      saved, or a file of it is cut short, missing or corrupt
      (:func:`damage`: the message names the array and the file).
    ValueError: the checkpoint is readable but does not fit ``like``.
  """
  path = _abspath(directory)
  metadata = _read_metadata(path)
  try:
    restored = _checkpointer().restore(
        path, args=ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(
            restore_target(like))}))
    tree = restored[_STATE]
  except Exception as e:  # pylint: disable=broad-except
    if like is None or damage(e) is not None:
      raise _unreadable(path, e) from e
    raise ValueError(
        f"The checkpoint at {path} does not fit the requested structure "
        f"({type(e).__name__}: {failure_reason(e)})") from e
  if like is not None:
    tree = _check_like(path, like, tree)
  if CHECKSUMS in metadata:
    check_checksums(tree, metadata[CHECKSUMS], f"the checkpoint at {path}")
  return tree, {k: v for k, v in metadata.items()
                if k not in (CHECKSUMS, *SEALS)}


def _check_like(path: str, like: Any, tree: Any) -> Any:
  """Checks shapes/dtypes against ``like`` (orbax does not for numpy or
  ``ShapeDtypeStruct`` targets); such targets come back as ``jax.Array``."""
  wrong = []
  leaves = jax.tree_util.tree_flatten_with_path(like)[0]
  out = []
  for (keypath, want), got in zip(leaves, jax.tree.leaves(tree)):
    name = jax.tree_util.keystr(keypath)
    if hasattr(want, "shape") and tuple(want.shape) != tuple(np.shape(got)):
      wrong.append(f"{name}: shape {tuple(np.shape(got))}, expected "
                   f"{tuple(want.shape)}")
    elif hasattr(want, "dtype") and want.dtype != getattr(got, "dtype", None):
      wrong.append(f"{name}: dtype {getattr(got, 'dtype', type(got))}, "
                   f"expected {want.dtype}")
    if isinstance(want, (jax.ShapeDtypeStruct, jax.Array)):
      got = jnp.asarray(got)
    out.append(got)
  if wrong:
    raise ValueError(f"The checkpoint at {path} does not fit the requested "
                     f"structure: {'; '.join(wrong)}")
  return jax.tree.unflatten(jax.tree.structure(like), out)
