"""Agent loop, asynchronous rollout, sync baseline and the trajectory queue."""

from verltool_jax.rollout.config import RolloutConfig
from verltool_jax.rollout.trajectory import Trajectory

__all__ = ["RolloutConfig", "Trajectory"]
