"""Control plane: the scheduler (`scheduler/`, a pure library), the control loop
(`control/`), the custom resources (`api/`), the kopf operator (`kube/`) and `cadence run`
on one machine (`local/`).

Installed as `cadence.operator`. The folder keeps the name `operator/` that the project
layout gives it, which is also the name of a standard-library module that `collections`
(and so nearly every program) imports. Whenever the repository root is first on
`sys.path` (`python -m ...` or `python -c ...` run from a checkout), Python would find
this folder instead of the standard module and fail at start-up. In that one case this
file makes itself the standard module, so a checkout never breaks the interpreter.
"""

if __name__ == "operator":  # pragma: no cover - only when imported from a checkout root
    import os as _os

    _path = _os.path.join(_os.path.dirname(_os.__file__), "operator.py")
    with open(_path, encoding="utf-8") as _source:
        exec(compile(_source.read(), _path, "exec"))
    del _os, _path, _source
