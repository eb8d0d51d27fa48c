"""Teaching: real models described by their specs (arch), their sizing arithmetic (sizing) and
the chapters' rules of thumb beside it (rules), all pure Python; the derivation drills (drills/)
and the chapters' exercises (exercises/)."""
