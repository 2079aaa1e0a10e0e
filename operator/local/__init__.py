"""`cadence run`: the whole system on one machine. Worker and trainer processes
(`processes.py`), the run itself with its control loop (`run.py`), the live view and the
report, and the same run file as a simulator scenario (`simulate.py`)."""
