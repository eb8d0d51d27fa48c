"""grads: a generic finite-difference gradient checker for forward/backward pairs.

    report = grads.check(forward, backward, x=x, W=W)    # every float64 input is checked
    print(report); assert report.ok

`python -m grads` runs the registered case of every component (the grads/cases/
package, one module per topic).
"""
from grads.check import TOLERANCE, Report, Row, check, relative_error

__all__ = ["check", "Report", "Row", "relative_error", "TOLERANCE"]
