"""The base layer: where tensors live and where random numbers come from.

``devices`` (the torch device and dtype of a stage) and ``seeding`` (counter-based random streams,
docs/experiments.md#seeds-and-streams). Imports nothing from the rest of largeprompt.
"""
