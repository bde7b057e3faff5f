"""Diagnose stage: `main.diagnose_cell` (one trained cell) and the weight-space metrics (`weights`)."""
