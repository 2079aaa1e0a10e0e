"""The paper's baselines, each modelled on its authors' system (../shared/BASELINES.md)
and driven through the same `plan(snapshot, state)` interface as Cadence."""
