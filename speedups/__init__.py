"""Exact speed-ups of the paper's plain computations: each beside the plain version it accelerates (named in its docstring), with an equivalence test."""
