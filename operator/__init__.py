"""Control plane: the scheduler (a pure library), and later the control loop, the API
models and the kopf operator.

Installed as `cadence.operator`: a top-level package named `operator` would be shadowed by
the standard library's module, which the interpreter preloads at start-up.
"""
