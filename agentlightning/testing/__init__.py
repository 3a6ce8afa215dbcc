"""Test doubles that run as real servers, for the tests, the benchmarks and anyone testing an agent
against Agent Lightning without a model: in-process (a background thread) or as a process.

* `fake_model_server`: a vLLM-shaped OpenAI server with a toy tokenizer, scriptable replies and faults.
* `scripted_model`: a chat model that speaks like vLLM serving Qwen2.5 (real template and BPE),
  whose text a `Policy` chooses; `scripted_policies` holds the examples' policies.
* `replica_batch`: a batch of rollouts over several Gateway replicas that are killed and restarted.
"""
