"""The reference GRPO/PPO trainer, weight publishing and the trainer-side client.

Installed as `cadence.trainer`. Empty until the trainer is built.
"""
