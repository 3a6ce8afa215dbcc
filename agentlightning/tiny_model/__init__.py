"""The tiny policy built in code: a byte-level BPE tokenizer with a Hermes chat template, and a Qwen2.

The torch backend's built-in model (`model.path: demo`), used by the demo, the tests, the benches
and examples that train a small policy on a CPU. Nothing is downloaded: the tokenizer ships with
the package (`tokenizer.json`, trained on the demo's own conversations: short sequences make the
tiny model learn fast; `agentlightning.demo.warmup.tokenizer_json` trains it again, and a test
checks that it gives this file), the model is a randomly initialised Qwen2 sized by
`TinyModelConfig`.

Re-rendering is exact: the template re-renders an assistant turn from the parsed message
(content, and tool calls with their arguments in canonical `json.dumps` form, as the server
returns them) byte for byte, and turn markers are added tokens, so the second call's prompt
starts with exactly the ids of the first call's prompt and response — and the trainer merges
a rollout's calls into one row — whenever the model wrote its turn in canonical tokens (what
it was trained on; the demo measures how often it did not).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Chat-template markers. `<tool_call>` and friends are ordinary (non-special) added tokens so
# that they survive `skip_special_tokens=True` decoding and reach the tool-call parser, as in
# Qwen2.5; the turn markers are special and never appear in returned text.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKER_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Hermes-style template, Qwen2.5's layout with a compact tool list. Assistant tool calls are
# rendered as `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>` with ARGS verbatim
# when it is a string (what the OpenAI API carries), so the rendering is byte-identical to
# what the model generated when the model wrote canonical JSON.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n' }}{%- endif %}"
    "{{- 'Tools:' }}"
    "{%- for tool in tools %}"
    "{%- set fn = tool.function if tool.function is defined else tool %}"
    "{%- set props = fn.parameters.properties if fn.parameters is defined"
    " and fn.parameters.properties is defined else {} %}"
    "{{- ' ' + fn.name + '(' + (props | list | join(', ')) + ')' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}{%- for tc in message.tool_calls %}"
    "{%- set call = tc.function if tc.function is defined else tc %}"
    "{%- if not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' }}'
    "{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass
class TinyModelConfig:
    """Size of the tiny policy (a Qwen2 decoder, random init)."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 1024
    # Separate output head: a reload of new weights into vLLM keeps a tied head stale.
    tie_word_embeddings: bool = True
    # Every layer attends to the last N tokens only (None: the whole context). A model fitted
    # on windows then computes in a long prompt exactly what it computed in its window.
    sliding_window: int | None = None


TOKENIZER_FILE = Path(__file__).with_name("tokenizer.json")


def byte_tokenizer() -> Any:
    """256 byte tokens (no merges) plus the markers, with the chat template: lossless on any text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    return _wrap(tok)


def bpe_json(texts: list[str], vocab_size: int) -> str:
    """A byte-level BPE trained on `texts`, with the template's markers, as tokenizer JSON (the
    recipe of `TOKENIZER_FILE`; other tiny policies, e.g. examples/swe/tiny_policy.py, train it on
    their own conversations and wrap it with `tokenizer_from_json`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *MARKER_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok.to_str()


def build_tokenizer() -> Any:
    """The tiny model's tokenizer: byte-level BPE trained on the demo's conversations (`TOKENIZER_FILE`).

    Bytes are in the vocabulary, so any text encodes and decodes losslessly; digits are always
    single tokens. Template markers are added tokens, so a BPE piece never crosses a turn
    boundary and rendering a conversation turn by turn gives the same ids as rendering it whole.
    """
    return tokenizer_from_json(TOKENIZER_FILE.read_text(encoding="utf-8"))


def tokenizer_from_json(text: str) -> Any:
    """A `bpe_json` tokenizer as the Hugging Face fast tokenizer with the chat template."""
    from tokenizers import Tokenizer

    return _wrap(Tokenizer.from_str(text))


def _pre_tokenizer() -> Any:
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


def _wrap(tok: Any) -> Any:
    from tokenizers import AddedToken, decoders
    from transformers import PreTrainedTokenizerFast

    if tok.pre_tokenizer is None:
        tok.pre_tokenizer = _pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=TinyModelConfig.max_position_embeddings,
        padding_side="left",
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_model(config: TinyModelConfig | None = None, seed: int = 0, tokenizer: Any = None) -> Any:
    """A randomly initialised Qwen2ForCausalLM sized by `config`, in float32 on CPU."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = config or TinyModelConfig()
    tokenizer = tokenizer or build_tokenizer()
    hf_config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",  # type: ignore[call-arg]  # a PretrainedConfig keyword, not in Qwen2Config's signature
        use_sliding_window=config.sliding_window is not None,
        max_window_layers=0,  # with a window: every layer's
        **asdict(config),
    )
    # Seed only our own generator so that building a model does not disturb the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(hf_config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.float().eval()


def build_tiny(config: TinyModelConfig | None = None, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer): the torch backend's built-in `demo` model."""
    tokenizer = build_tokenizer()
    return build_model(config, seed, tokenizer), tokenizer


def save_tiny(path: str | Path, model: Any, tokenizer: Any) -> Path:
    """Save in the Hugging Face layout, loadable with `from_pretrained` (and by vLLM)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
