"""The Rollout Controller (agl-controller): turns queued rollouts into running agents."""
