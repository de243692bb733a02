"""One run: typed configs, the plan, the job folder, training, evaluation, sweeps."""
