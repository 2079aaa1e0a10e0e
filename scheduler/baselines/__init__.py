"""The paper's baselines, each modelled on its authors' system (docs/concepts.md, "The baselines")
and driven through the same `plan(snapshot, state)` interface as Cadence."""
