"""File helpers: streaming hashes and all-or-nothing output directories."""

from __future__ import annotations

import hashlib
import os
import shutil
from contextlib import contextmanager
from pathlib import Path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks so large checkpoints don't fill memory."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


PACKED_DIR = ".packed"  # the runtime's packed-weights files beside a deployment


def _recover(final: Path) -> None:
    """Finish a swap that an earlier, interrupted build left half done."""
    backup = final.with_name(final.name + ".previous")
    if backup.exists() and not final.exists():
        backup.rename(final)
    elif backup.exists():
        shutil.rmtree(backup)


@contextmanager
def staged_dir(final: Path):
    """Yield an empty staging folder beside ``final``; on success it replaces ``final``.

    If the body raises (or the process dies), ``final`` is untouched and the
    staging folder is removed (or left as ``.staging-*`` debris that the next
    build clears). The swap is two renames on one file system. The runtime's
    packed-weights files (``.packed/``, lora_share.h PACKED WEIGHTS) move into
    the new folder: each names the foundation and program it is for, so a
    rebuild or an ``add`` that keeps them starts warm, and one that changes
    them starts cold without reading a stale file.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _recover(final)
    staging = final.with_name(f"{final.name}.staging-{os.getpid()}")
    for old in final.parent.glob(f"{final.name}.staging-*"):
        shutil.rmtree(old, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    packed = final / PACKED_DIR
    if packed.is_dir() and not (staging / PACKED_DIR).exists():
        packed.rename(staging / PACKED_DIR)
    backup = final.with_name(final.name + ".previous")
    if final.exists():
        final.rename(backup)
    staging.rename(final)
    if backup.exists():
        shutil.rmtree(backup)
