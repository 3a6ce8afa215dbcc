"""The model proxy: OpenAI calls of a rollout, forwarded to an inference server and recorded."""
