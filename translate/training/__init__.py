"""Training: the run as named phases, the jitted steps, losses, the optimizer, monitoring, plots."""
