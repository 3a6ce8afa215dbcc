"""Default Hydra configs of the command-line entry points (server.yaml, controller.yaml)."""
