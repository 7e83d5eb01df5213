"""Running experiments: the loop around the pure round functions."""

from augfl_jax.training import progress
from augfl_jax.training.progress import Progress
