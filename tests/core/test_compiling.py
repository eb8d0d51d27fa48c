"""CompileLog counts real compilations only (a cached or already compiled kernel is not one),
one record per top-level kernel; PhaseClock's phases and "other" add up to the total; an
inner_kernel compiles without a Python entry point and refuses calls from Python."""
import os
import re
import time

import numba
import numpy as np
import pytest

from scratchllm.core.compiling import CompileLog, PhaseClock, inner_kernel


def _kernels():
    @numba.njit
    def inner(x):
        return x + 1

    @numba.njit
    def outer(x):
        return inner(x) * 2
    return inner, outer


def test_compile_log_counts_each_new_specialisation_once():
    inner, outer = _kernels()
    with CompileLog() as log:
        outer(1.0)      # compiles outer, and inner inside it
        outer(2.0)      # nothing new
        outer(np.int64(3))  # a second specialisation of outer (inner's is nested again)
    assert [r[0] for r in log.records] == ["_kernels.<locals>.outer"] * 2
    assert log.nested == 2 and log.seconds > 0
    outer(4.0)
    assert log.count == 2  # no longer listening


def test_phase_clock_splits_the_wall_time_and_labels_compilations():
    _, outer = _kernels()
    clock = PhaseClock()
    with clock.phase("data"):
        with clock.phase("BPE training"):
            outer(1.0)
        time.sleep(0.02)
    timed = clock.timed("train", outer)
    assert timed(2.0) == 6.0
    clock.close()
    assert list(clock.seconds) == ["data", "BPE training", "train"]
    assert clock.seconds["data"] >= 0.02 and clock.seconds["BPE training"] > 0
    assert [r[1] for r in clock.log.records] == ["BPE training"]
    line = clock.summary()
    assert line.startswith("time: ") and "Numba compiled 1 kernel in" in line
    assert "BPE training" in line and ", other " in line
    cpu = re.search(r"; CPU ([0-9.]+) s \(this process ([0-9.]+) s, its finished child "
                    r"processes ([0-9.]+) s\)$", line)
    t = os.times()
    assert cpu and float(cpu[2]) <= t.user + t.system + 0.05
    assert abs(float(cpu[1]) - float(cpu[2]) - float(cpu[3])) <= 0.11
    clock.close()  # idempotent


@inner_kernel
def _halve(x):
    return x // 2


@numba.njit
def _halve_then_add(x, y):
    return _halve(x) + y


def test_inner_kernel_has_no_python_entry_and_refuses_python_calls():
    assert _halve_then_add(np.int64(9), np.int64(1)) == 9 // 2 + 1
    (sig,) = _halve.signatures
    cres = _halve.overloads[sig]
    assert cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name) != 0
    assert cres.library.get_pointer_to_function(cres.fndesc.llvm_cpython_wrapper_name) == 0
    with pytest.raises(TypeError, match="_halve is an inner kernel"):
        _halve(np.int64(9))
