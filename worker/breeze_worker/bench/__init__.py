"""Engine benchmark: models with random weights, measuring instruments, variants, report."""
