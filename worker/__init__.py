"""Data plane: the rollout worker service and its engines (vLLM, emulated).

Installed as `cadence.worker`. Empty until the worker service is built.
"""
