"""nbcache.drop_stale: a module's Numba cache files older than a module it calls are deleted;
newer ones, and other modules' files, stay."""
import os

from scratchllm.tokenizer import nbcache


def test_drop_stale_removes_only_the_older_cache_files_of_the_module(tmp_path):
    (tmp_path / "__pycache__").mkdir()
    for name in ("kern.py", "dep.py"):
        (tmp_path / name).write_text("")
    old, new, other = (tmp_path / "__pycache__" / n for n in
                       ("kern.f-10.py311.nbi", "kern.g-20.py311.1.nbc", "kern_x.f-1.py311.nbi"))
    for f in (old, new, other):
        f.write_text("")
    os.utime(old, (1000, 1000))
    os.utime(other, (1000, 1000))
    os.utime(tmp_path / "dep.py", (2000, 2000))
    os.utime(new, (3000, 3000))
    nbcache.drop_stale(str(tmp_path / "kern.py"), "dep.py")
    assert not old.exists() and new.exists() and other.exists()
