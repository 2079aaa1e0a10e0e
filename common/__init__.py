"""What every part of Cadence shares and none owns: the accelerator and model catalog,
the roofline physics of a deployment (the simulator models it, the emulated engine paces
by it, the operator sizes workers with it), percentiles, the HTTP service helpers every
Cadence service and client uses, and the tokenizer wrapper. Imports nothing of the
project (tests/test_import_contract.py), so anything may import it."""
