"""The rollout-pool simulator: modelled accelerators and models, driven by the same
scheduling policies the runtime uses. Installed as `cadence.sim`."""
