"""The built-in training backend: OpenAI-compatible inference server and GRPO/PPO update in PyTorch."""
