"""What runs while training: updater, replica workers, channels between the
workers and the host, the host accumulator and its update rules, transfers."""
