"""The Numba entry points of the tokenizer check what their kernels index (kernel_checks.py):
bad offsets, invalid or truncated UTF-8, foreign tables and out-of-range words raise a clear
error instead of reading out of bounds (a segfault, or garbage ids)."""
import numpy as np
import pytest

from scratchllm.tokenizer import Tokenizer, fast, fast_bpe
from scratchllm.tokenizer.fast_train import merge_loop_numba

TEXT = "Hello wörld, it's 2024!".encode("utf-8")
DATA = np.frombuffer(TEXT, np.uint8)


def ends(*values):
    return np.array(values, dtype=np.int64)


def test_scan_gpt2_still_scans_good_input():
    got = fast.scan_gpt2(DATA, fast.char_classes(), ends(len(TEXT)))
    assert [TEXT[a:b] for a, b in zip([0, *got[:-1]], got)] == [
        b"Hello", b" w\xc3\xb6rld", b",", b" it", b"'s", b" 2024", b"!"]


@pytest.mark.parametrize("seg_ends, match", [
    (ends(10 ** 9), r"seg_ends must be non-decreasing offsets in \[0, 24\]"),
    (ends(-5), r"seg_ends must be non-decreasing offsets"),
    (ends(10, 4), r"seg_ends must be non-decreasing offsets"),
    (ends(8), r"seg_ends splits a UTF-8 character"),         # inside "ö"
    (np.array([23], dtype=np.int32), r"seg_ends must be a 1-d int64 array, got int32"),
])
def test_scan_gpt2_refuses_bad_offsets(seg_ends, match):
    with pytest.raises((ValueError, TypeError), match=rf"^scan_gpt2: {match}"):
        fast.scan_gpt2(DATA, fast.char_classes(), seg_ends)


@pytest.mark.parametrize("data", [b"abc\xc3", b"\xff\xfe", b"ab\xf7\xbf\xbf\xbf"])
def test_scan_gpt2_refuses_invalid_or_truncated_utf8(data):
    arr = np.frombuffer(data, np.uint8)
    with pytest.raises(ValueError, match=r"^scan_gpt2: data is not valid UTF-8"):
        fast.scan_gpt2(arr, fast.char_classes(), ends(len(data)))


def test_scan_gpt2_refuses_a_wrong_class_table_and_data_type():
    with pytest.raises(TypeError, match=r"^scan_gpt2: cls must be char_classes\(\)"):
        fast.scan_gpt2(DATA, np.zeros(10, np.uint8), ends(len(TEXT)))
    with pytest.raises(TypeError, match=r"^scan_gpt2: data must be a 1-d uint8 array"):
        fast.scan_gpt2(DATA.astype(np.int64), fast.char_classes(), ends(len(TEXT)))


def test_unique_pretokens_refuses_ends_past_the_data():
    with pytest.raises(ValueError, match=r"^unique_pretokens: ends must be non-decreasing"):
        fast.unique_pretokens(DATA, ends(3, 10 ** 6))


def test_encode_pieces_refuses_foreign_tables_and_offsets():
    tok = Tokenizer({b: bytes([b]) for b in range(256)}, [])
    keys, ranks, news = tok._table
    cls, cache = fast.char_classes(), fast.new_cache(16, 8, 4)
    good = dict(kind=fast.GPT2, cls=cls, data=DATA, segments=(ends(len(TEXT)), ends(-1)),
                byte_ids=tok._byte_ids, table=(keys, ranks, news), cache=cache)
    assert fast.encode_pieces(**good).tolist() == list(TEXT)
    bad = [(dict(segments=(ends(99), ends(-1))), r"seg_ends must be non-decreasing"),
           (dict(segments=(ends(len(TEXT)), ends(-1, -1))),
            r"seg_special must be int64 of seg_ends' shape"),
           (dict(segments=(ends(len(TEXT)), ends(1 << 40))), r".*ids < 2\^31"),
           (dict(byte_ids=tok._byte_ids[:10]), r"byte_ids must be 256 integer ids"),
           (dict(table=(keys[:3], ranks, news)), r"keys, ranks, news must be merge_table\(\)'s"),
           (dict(cache=cache[:3]), r"cache must come from new_cache\(\)"),
           (dict(cache=cache[:6] + (np.array([99, 0, 0]),)),
            r"cache must come from new_cache\(\)")]
    for change, match in bad:
        with pytest.raises((ValueError, TypeError), match=rf"^encode_pieces: {match}"):
            fast.encode_pieces(**dict(good, **change))


def test_merge_table_refuses_ids_beyond_int32():
    with pytest.raises(ValueError, match=r"^merge_table: .*ids in \[0, 2\^31\)"):
        fast_bpe.merge_table(np.array([[1, 1 << 33]]), np.array([256]))


def _words(*words):
    sym = np.concatenate([np.frombuffer(w, np.uint8) for w in words]).astype(np.int64)
    length = np.array([len(w) for w in words], dtype=np.int64)
    return sym, np.cumsum(length) - length, length, np.ones(len(words), dtype=np.int64)


def test_merge_loop_runs_on_good_words_and_refuses_bad_ones():
    sym, start, length, freq = _words(b"abab", b"ab")
    assert list(merge_loop_numba(sym.copy(), start, length.copy(), freq, 2)) == [
        (97, 98), (256, 256)]
    bad = [((sym + 300, start, length, freq, 2), r"sym must hold byte ids in \[0, 256\)"),
           ((sym, start + 10 ** 6, length, freq, 2), r"every word must lie inside sym"),
           ((sym, start, -length, freq, 2), r"every word must lie inside sym"),
           ((sym, start * 0, length, freq, 2), r"the words must follow each other"),
           ((sym, start, length, freq[:1], 2), r".*one entry per word"),
           ((sym, start, length, freq, -1), r"n_merges must be an integer"),
           ((sym.astype(np.int32), start, length, freq, 2), r"sym must be a 1-d int64 array")]
    for args, match in bad:
        with pytest.raises((ValueError, TypeError), match=rf"^merge_loop_numba: {match}"):
            merge_loop_numba(*args)
