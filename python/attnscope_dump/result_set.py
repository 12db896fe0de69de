"""Result sets: the files of one run, trusted only through the manifest that lists them.

Every `attnscope` command publishes its files together with a manifest, its JSON run record
(e.g. `confusion.json`), written last; the manifest's "files" lists each file with its size and
SHA-256 (docs/cli/common-flags.md, "Output files"). A folder whose manifest is missing, or whose
files do not match it, holds an interrupted or damaged run: readers refuse it.

Standard library only, so scripts and tests can run it without the dumper's dependencies:

    python3 python/attnscope_dump/result_set.py verify RESULTS_DIR_OR_MANIFEST...

prints one line per set and exits 1 when any set is missing or does not match its manifest.
`publish()` writes a set the same way the C++ commands do (used by python/inline_fig1.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys
import uuid

MANIFEST_FORMAT = 1
STAGING_PREFIX = ".attnscope-tmp-"


class ResultSetError(Exception):
    """A result set that is incomplete, damaged or missing its manifest."""


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _plain_name(name) -> bool:
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and os.sep not in name and "\0" not in name)


def read_manifest(path: str) -> dict:
    """The manifest at `path`, its structure checked (not yet its files)."""
    try:
        with open(path) as f:
            m = json.load(f)
    except FileNotFoundError:
        raise ResultSetError(f"{path}: no manifest: the run did not finish, or was interrupted "
                             f"while publishing; run it again") from None
    except (OSError, ValueError) as e:
        raise ResultSetError(f"{path}: unreadable manifest: {e}") from None
    if not isinstance(m, dict) or m.get("manifest_format") != MANIFEST_FORMAT:
        raise ResultSetError(f"{path}: expected a result-set manifest (manifest_format "
                             f"{MANIFEST_FORMAT}), found none: written before manifests existed, "
                             f"or not a manifest")
    files = m.get("files")
    if not isinstance(files, list) or not all(
            isinstance(e, dict) and _plain_name(e.get("name")) and isinstance(e.get("bytes"), int)
            and isinstance(e.get("sha256"), str) for e in files):
        raise ResultSetError(f"{path}: malformed \"files\" list")
    return m


def verify(manifest_path: str) -> dict:
    """Checks every file the manifest lists: present, of the listed size and SHA-256.
    Returns the manifest; raises ResultSetError naming the first file that does not match."""
    m = read_manifest(manifest_path)
    folder = os.path.dirname(os.path.abspath(manifest_path))
    for e in m["files"]:
        p = os.path.join(folder, e["name"])
        try:
            size = os.path.getsize(p)
        except OSError:
            raise ResultSetError(f"{p}: listed by {manifest_path} but missing") from None
        if size != e["bytes"]:
            raise ResultSetError(f"{p}: expected {e['bytes']} bytes as {manifest_path} lists, "
                                 f"found {size}: not the file of that run")
        if sha256_file(p) != e["sha256"]:
            raise ResultSetError(f"{p}: SHA-256 differs from {manifest_path}: not the file of "
                                 f"that run")
    return m


def manifests_in(folder: str) -> list[str]:
    """Paths of the result-set manifests in `folder` (JSON files with manifest_format)."""
    out = []
    for name in sorted(os.listdir(folder)):
        p = os.path.join(folder, name)
        if not name.endswith(".json") or not os.path.isfile(p):
            continue
        try:
            with open(p) as f:
                m = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(m, dict) and "manifest_format" in m:
            out.append(p)
    return out


_verified: dict = {}


def _stamp(path: str):
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def verified_path(path: str) -> str:
    """`path` once the manifest listing it, and every file of that set, check out (the check is
    remembered until the manifest changes). Raises ResultSetError when no manifest in its folder
    lists the file, or the set does not match its manifest."""
    path = os.path.abspath(path)
    folder, name = os.path.split(path)
    for manifest in manifests_in(folder):
        try:
            listed = [e.get("name") for e in read_manifest(manifest)["files"]]
        except ResultSetError:
            continue
        if name not in listed:
            continue
        key = (manifest, _stamp(manifest))
        if key not in _verified:
            verify(manifest)
            _verified[key] = True
        return path
    raise ResultSetError(f"{path}: no manifest in {folder} lists it: the run that wrote it did "
                         f"not finish, or was interrupted while publishing; run it again")


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a folder
    finally:
        os.close(fd)


class Staging:
    """The staging folder of one set: write each file at path(name), then publish(record)."""

    def __init__(self, folder: str, manifest: str):
        if not _plain_name(manifest):
            raise ValueError(f"bad manifest name {manifest!r}")
        self.folder, self.manifest, self.names = folder, manifest, []
        self.dir = os.path.join(folder, f"{STAGING_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}-"
                                        f"{socket.gethostname()}")
        os.makedirs(folder, exist_ok=True)
        os.mkdir(self.dir)
        self.published = False

    def path(self, name: str) -> str:
        if not _plain_name(name) or name == self.manifest:
            raise ValueError(f"bad result file name {name!r}")
        if name not in self.names:
            self.names.append(name)
        return os.path.join(self.dir, name)

    def publish(self, record: dict) -> str:
        files = []
        for name in self.names:
            p = os.path.join(self.dir, name)
            with open(p, "rb") as f:
                os.fsync(f.fileno())
            files.append({"name": name, "bytes": os.path.getsize(p), "sha256": sha256_file(p)})
        record = dict(record, files=files, manifest_format=MANIFEST_FORMAT)
        with open(os.path.join(self.dir, self.manifest), "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        final = os.path.join(self.folder, self.manifest)
        lock = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                old = [e["name"] for e in read_manifest(final)["files"]]
            except ResultSetError:
                old = []
            with contextlib.suppress(FileNotFoundError):
                os.unlink(final)  # from here on the old set is withdrawn
            _fsync_dir(self.folder)
            for name in self.names:
                os.rename(os.path.join(self.dir, name), os.path.join(self.folder, name))
            for name in old:
                if _plain_name(name) and name != self.manifest and name not in self.names:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.folder, name))
            _fsync_dir(self.folder)
            os.rename(os.path.join(self.dir, self.manifest), final)
            _fsync_dir(self.folder)
        finally:
            os.close(lock)
        os.rmdir(self.dir)
        self.published = True
        return final

    def discard(self) -> None:
        if not self.published:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def publish(folder: str, manifest: str):
    """`with publish(out, "x.json") as st:` write files at st.path(name), then call
    st.publish(record); leaving the block without publishing removes everything staged."""
    st = Staging(folder, manifest)
    try:
        yield st
    finally:
        st.discard()


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "verify":
        print("usage: result_set.py verify RESULTS_DIR_OR_MANIFEST...", file=sys.stderr)
        return 2
    bad = 0
    for target in args[1:]:
        try:
            manifests = manifests_in(target) if os.path.isdir(target) else [target]
            if not manifests:
                raise ResultSetError(f"{target}: no manifest: no run finished here, or the last "
                                     f"was interrupted while publishing")
            for m in manifests:
                n = len(verify(m)["files"])
                print(f"{m}: ok ({n} files)")
        except ResultSetError as e:
            bad += 1
            print(f"result_set: {e}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
