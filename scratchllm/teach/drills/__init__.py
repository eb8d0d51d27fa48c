"""Derivation drills: core.py (the Drill record, running its checks, `start`), bank/ (the
drills, one module per topic)."""
