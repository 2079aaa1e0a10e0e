"""The reference GRPO/PPO trainer as a service: the SQLite ledger every sample ends in
exactly once, admission under the staleness bound, weight publishing, and the client the
control loop and external trainers use. Installed as `cadence.trainer`; `config.py` is
torch-free so the operator can build a trainer's config without loading torch."""
