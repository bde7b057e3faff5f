"""Diagnose stage: `main.diagnose_cell` (one trained cell), the weight-space metrics (`weights`) and W0's
factors shared by every cell of a base model (`cache`)."""
