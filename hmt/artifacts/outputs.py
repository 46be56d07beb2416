"""The one rule for every path hmt writes or removes: replace only what hmt wrote, of the same kind.

Every writer calls :func:`check_output_dir` (artifact directories) or :func:`check_output_file`
(single files: archives, exported profiles, keys, timelines) before it replaces a path, and
:func:`remove_owned_files` instead of deleting a folder it did not create. Refused, with an
:class:`~hmt.errors.InputError` (exit 3) and nothing touched:

- the root, the home directory, the working directory, or a folder above any of them;
- any of the command's own inputs, a folder holding one, or a path inside one;
- a non-empty folder that is not an hmt artifact (no readable ``manifest.json``), or an
  artifact holding files its manifest does not list (someone put them there);
- an artifact of another kind, unless ``force`` (which never replaces a non-artifact folder);
- an existing file that the caller does not recognise as its own kind of file.

Messages name the path as the user gave it and the option it came from.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from hmt.artifacts.jsondoc import parse_json
from hmt.artifacts.manifest import MANIFEST_NAME, Manifest
from hmt.errors import ArtifactError, InputError

# Files an artifact directory holds beside those its manifest lists.
_UNLISTED_OK = frozenset({MANIFEST_NAME, "manifest.sig"})


def _real(path: Path | str) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _is_within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def _protected(real: Path) -> str | None:
    """Why ``real`` may never be replaced, or None."""
    if real == Path(real.anchor):
        return "the root directory"
    home = _real(Path.home())
    if _is_within(home, real):
        return "the home directory" if real == home else f"a folder above the home directory ({home.name})"
    cwd = _real(Path.cwd())
    if _is_within(cwd, real):
        return "the working directory" if real == cwd else "a folder above the working directory"
    return None


def _refuse_protected(given: Path, inputs: Iterable[Path | str], what: str, expected: str) -> None:
    """A protected place (a user folder, ``.``, home, a system folder) or one of the command's inputs
    is refused by name; ``expected`` says what to give instead."""
    real = _real(given)
    reason = _protected(real)
    if reason is not None:
        raise InputError(f"{what} {given}: is {reason}; {expected}")
    _check_inputs(given, real, inputs, what)


def _check_inputs(given: Path, real: Path, inputs: Iterable[Path | str], what: str) -> None:
    for item in inputs:
        source = _real(item)
        if real == source:
            raise InputError(f"{what} {given}: is an input of this command ({item}); choose another output path")
        if _is_within(source, real):
            raise InputError(f"{what} {given}: holds the input {item} of this command; choose another output path")
        if _is_within(real, source):
            raise InputError(f"{what} {given}: lies inside the input {item} of this command; "
                             "choose a path outside it")


def manifest_kind(path: Path) -> str | None:
    """The kind of the hmt artifact in ``path``, or None when it has no readable hmt manifest."""
    try:
        data = parse_json((path / MANIFEST_NAME).read_bytes(), path / MANIFEST_NAME)
        return Manifest.from_json_dict(data, source=str(path / MANIFEST_NAME)).kind
    except (OSError, ValueError, ArtifactError):
        return None


def _unlisted(path: Path) -> str | None:
    """A file or folder in artifact ``path`` that its manifest does not list (the first found)."""
    try:
        manifest = Manifest.from_json_dict(parse_json((path / MANIFEST_NAME).read_bytes(), path / MANIFEST_NAME),
                                          source=str(path))
    except (OSError, ValueError, ArtifactError):
        return MANIFEST_NAME
    listed = {record.path for record in manifest.files} | _UNLISTED_OK
    for dirpath, dirnames, filenames in os.walk(path):
        rel_dir = Path(dirpath).relative_to(path)
        # An empty folder is no loss; a file in any folder must be listed (links count as files).
        for name in [*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))]:
            rel = (rel_dir / name).as_posix()
            if rel not in listed:
                return rel
    return None


def check_output_dir(out: Path | str, *, kind: str, inputs: Iterable[Path | str] = (), force: bool = False,
                     what: str = "--out") -> Path:
    """Refuse ``out`` unless writing an artifact of ``kind`` there destroys nothing the user owns.

    Allowed: a path that does not exist, an empty folder, or an artifact of ``kind`` (of any
    kind with ``force``) holding nothing but what its manifest lists. Returns ``out`` as a Path.
    """
    given = Path(out)
    _refuse_protected(given, inputs, what, "hmt writes its output into a folder of its own, e.g. runs/NAME")
    if os.path.islink(given):
        raise InputError(f"{what} {given}: is a symbolic link; give the folder it points to, or a new path")
    if not os.path.lexists(given):
        return given
    if not given.is_dir():
        raise InputError(f"{what} {given}: exists and is not a folder; hmt will not replace it")
    try:
        empty = not any(os.scandir(given))
    except OSError as exc:
        raise InputError(f"{what} {given}: cannot be read ({exc.strerror})") from exc
    if empty:
        return given
    found = manifest_kind(given)
    if found is None:
        raise InputError(f"{what} {given}: is a folder that is not an hmt artifact (no valid {MANIFEST_NAME}); "
                         "hmt replaces only its own artifacts, and never a folder of yours (not even with "
                         "--force); choose a new path")
    if found != kind and not force:
        raise InputError(f"{what} {given}: holds a {found!r} artifact; this command writes a {kind!r} artifact. "
                         "Choose another path, or pass --force to replace it")
    stray = _unlisted(given)
    if stray is not None:
        raise InputError(f"{what} {given}: holds {stray}, which its {MANIFEST_NAME} does not list; hmt will not "
                         "delete files it did not write: move it, or choose another path")
    return given


def check_output_file(path: Path | str, *, recognise: Callable[[Path], bool], description: str,
                      inputs: Iterable[Path | str] = (), what: str = "--out") -> Path:
    """Refuse to replace ``path`` unless it does not exist or ``recognise(path)`` says it is hmt's
    own file of the kind the caller writes (``description`` names that kind in the error)."""
    given = Path(path)
    _refuse_protected(given, inputs, what, "expected a file path")
    if not os.path.lexists(given):
        return given
    if os.path.islink(given) or not given.is_file():
        raise InputError(f"{what} {given}: exists and is not a plain file; hmt will not replace it")
    try:
        ours = recognise(given)
    except (OSError, ValueError):
        ours = False
    if not ours:
        raise InputError(f"{what} {given}: exists and is not {description}; hmt will not overwrite it: "
                         "move it, or choose another path")
    return given


def check_output_parent(folder: Path | str, *, what: str) -> Path:
    """Refuse ``folder`` when it is a protected place (the root, home, the working directory or a
    folder above them): an option naming a folder hmt writes its outputs into (``--offload-out OUT``
    writes ``OUT/device`` and ``OUT/peer``), each output checked on its own with :func:`check_output_dir`."""
    given = Path(folder)
    reason = _protected(_real(given))
    if reason is not None:
        raise InputError(f"{what} {given}: is {reason}; hmt writes its outputs into a folder of their own, "
                         "e.g. runs/offload")
    return given


def check_new_file(path: Path | str, *, what: str) -> Path:
    """Refuse ``path`` if anything exists there (files hmt never replaces, such as keys)."""
    given = Path(path)
    if os.path.lexists(given):
        raise InputError(f"{what} {given}: already exists; hmt never overwrites it: move it, or choose another path")
    return given


def check_owned_folder(folder: Path | str, *, names: Iterable[str], what: str,
                       inputs: Iterable[Path | str] = (), recognise: Callable[[Path], bool] | None = None) -> Path:
    """Refuse ``folder`` (a working folder hmt fills and later empties, such as checkpoints) unless it
    does not exist, or holds only files named in ``names`` (and hmt's temporaries of them); with
    ``recognise``, each such file must also be hmt's by its content (a user's summary.json is not)."""
    given = Path(folder)
    _refuse_protected(given, inputs, what, "give a folder of its own")
    if not os.path.lexists(given):
        return given
    if os.path.islink(given) or not given.is_dir():
        raise InputError(f"{what} {given}: exists and is not a folder")
    allowed = set(names)
    for entry in os.scandir(given):
        if entry.name in allowed and recognise is not None and not _recognised(recognise, Path(entry.path)):
            raise InputError(f"{what} {given}: holds {entry.name}, which hmt did not write (not what hmt writes "
                             "under that name); hmt would replace it, so move it or give a folder of its own")
        if entry.name in allowed or (entry.name.startswith(tuple(f".{n}.hmt~" for n in allowed))
                                     and entry.name.endswith(".tmp")):
            continue
        raise InputError(f"{what} {given}: holds {entry.name}, which hmt did not write there; hmt empties this "
                         "folder when it is done, so give a folder of its own")
    return given


def _recognised(recognise: Callable[[Path], bool], path: Path) -> bool:
    if os.path.islink(path) or not path.is_file():
        return False
    try:
        return recognise(path)
    except (OSError, ValueError):
        return False


def remove_owned_files(folder: Path | str, *, names: Iterable[str]) -> None:
    """Remove ``names`` from ``folder``, then the folder itself if that left it empty.

    Nothing else is deleted: a file someone put there keeps the folder."""
    root = Path(folder)
    for name in names:
        try:
            (root / name).unlink()
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            continue
    with contextlib.suppress(OSError):  # not empty (or gone): what is left is not ours to delete
        root.rmdir()
