"""`agl-doctor`: whether an agent harness's rollouts can be trained on as they are (cli.py)."""
