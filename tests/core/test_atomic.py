"""The one atomic writer: a reader sees the old file or the new one, never a torn one."""
import os

import pytest

from scratchllm.core import atomic


def test_write_replaces_the_file_and_flushes_file_and_directory(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text("old")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    atomic.write_text(path, "new\nline\n")
    assert path.read_bytes() == b"new\nline\n"
    assert len(synced) == 2  # the temp file's data, then the directory's entry (the rename)
    assert list(tmp_path.iterdir()) == [path]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "state.npz"
    path.write_bytes(b"old")

    def half_then_crash(tmp):
        tmp.write_bytes(b"ha")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic.atomic_write(path, half_then_crash)
    assert path.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [path]


def test_tokenizer_files_go_through_it(tmp_path, monkeypatch):
    from scratchllm.tokenizer import Tokenizer
    written = []
    real = atomic.atomic_write
    monkeypatch.setattr(atomic, "atomic_write", lambda p, w: (written.append(p), real(p, w)))
    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], {"<|endoftext|>": 256})
    tok.save(str(tmp_path / "tok.bpe"))
    tok.save_tiktoken(str(tmp_path / "tok.tiktoken"))
    assert [os.path.basename(p) for p in written] == ["tok.bpe", "tok.tiktoken"]
    assert Tokenizer.load(str(tmp_path / "tok.bpe")).encode("hi") == [104, 105]
