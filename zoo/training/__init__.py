"""Training: the loop, its data, learning-rate schedules and checkpoints."""
