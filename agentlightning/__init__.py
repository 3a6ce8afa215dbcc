"""Agent Lightning: train any agent with reinforcement learning in its real harness."""

__version__ = "0.1.0"
