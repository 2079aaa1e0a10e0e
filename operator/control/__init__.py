"""The control loop: the I/O shell around the pure scheduler, shared by the operator (one
loop per TrainingRun) and `cadence run`. It observes workers and the trainer's ledger
through their endpoints, plans, and applies the plan; `group_stats.py` turns a plan into
each group's demand for the autoscaler."""
