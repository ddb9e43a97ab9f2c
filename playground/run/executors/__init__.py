"""Where a run's cells are measured: in this process (`local`) or on a Ray cluster (`ray`)."""
