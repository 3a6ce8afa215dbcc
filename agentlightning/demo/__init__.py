"""The CPU demo: a tiny policy built in code, a calculator word-problem task, its agent and warm-up."""
