"""`agl-eval`: policies evaluated on a dataset split through the Gateway, the Controller and the
agent's harness (docs/eval.md). `metrics` (pass@k, intervals, paired differences), `policies`
(what a policy is, and how it is served), `rollouts` (the eval's rollouts in the store),
`report` (JSON, markdown, PNG), `cli` (the command)."""
