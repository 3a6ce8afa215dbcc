"""Test doubles that run as real servers: in-process (a background thread) for tests, as processes
for benchmarks (`python -m tests.fakes.<module>` from the repository root).

* `model_server`: a vLLM-shaped OpenAI server with a toy tokenizer, scriptable replies and faults.
* `scripted_model`: a chat model that speaks like vLLM serving Qwen2.5 (real template and BPE),
  whose text a `Policy` chooses; `scripted_policies` holds the examples' policies.
* `k8s_api`: the slice of the Kubernetes API the Controller's Kubernetes runner uses.
"""
