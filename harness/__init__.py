"""The experiment harness: the command line and its presets, data files, model loading, evaluation,
the comparison's statistics, sweeps of train.py processes, and path checks."""
