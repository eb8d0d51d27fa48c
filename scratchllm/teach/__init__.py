"""Teaching: sizing arithmetic of real models (sizing, pure Python) and derivation drills
(drills/)."""
