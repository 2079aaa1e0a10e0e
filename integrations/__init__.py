"""Cadence as the rollout backend of other trainers: each module adapts one trainer's
plug-in seams to a Cadence run in external-trainer mode (`cadence.trainer.client`)."""
