"""The API Gateway (agl-server): rollouts, events, model endpoints and the model proxy."""
