"""The one atomic writer: every file of the project that must never be seen half-written
(checkpoints, config.json, tokenizer files, Hugging Face directories) goes through it.

    write(tmp) -> fsync(tmp) -> os.replace(tmp, path) -> fsync(the directory)

A reader sees the old file or the new one, never a torn one; after the directory's fsync the
rename itself survives a power cut. The temporary name is `path`.tmp-PID, so a file left by a
killed process is recognisable (remove_stale_temps).
"""
import os
from pathlib import Path


def atomic_write(path, write):
    """Write `path` atomically: write(tmp) fills the temporary Path `path`.tmp-PID, which is
    flushed to disk, os.replace'd over `path`, and the directory entry flushed too. A failure
    leaves no temporary file behind (and the old `path`, if any, untouched)."""
    path = Path(path)
    tmp = Path(f"{path}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_directory(path.parent)


def _fsync_directory(directory):
    """Flush a directory's entries (the rename) to disk; a no-op where the OS cannot open a
    directory (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path, data):
    """atomic_write of a bytes payload."""
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def write_text(path, text):
    """atomic_write of a UTF-8 text payload, newlines written as given ("\\n")."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline=""))


def remove_stale_temps(directory):
    """Delete the temp files atomic_write left in `directory` when a process was killed
    mid-write (`NAME.tmp-PID` whose PID is no longer running). Returns how many."""
    removed = 0
    for tmp in Path(directory).glob("*.tmp-*"):
        pid = tmp.name.rsplit(".tmp-", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed += 1
    return removed


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
