"""The Kubernetes operator: kopf handlers (`handlers.py`), the objects they own as pure
functions (`children.py`), CRD generation from the resource models (`crds.py`), the
small Kubernetes client (`client.py`), what a run reports (`run_report.py`), the
operator's metrics and its entry point (`serve.py`). The kopf process imports no torch
(tests/test_import_contract.py)."""
