"""A run read as claims (docs/experiments.md#claims): ``verdicts`` (the rules that turn a measured value with its
interval into agrees, disagrees or inconclusive), ``claims`` (each claim of the paper and of this project, computed
from a run's own tables) and ``compare`` (two runs side by side). May import :mod:`largeprompt.maths`; reads
tables through a callable, so it imports nothing of ``io``."""
