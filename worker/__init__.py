"""Data plane: the rollout worker service (`core.py`, `app.py`, a host of several
workers in `host.py`) and its engines behind one interface (`engine.py`): vLLM, and the
emulated engine for machines without the accelerator a pool describes. Installed as
`cadence.worker`; it imports nothing of the operator, trainer or simulator."""
