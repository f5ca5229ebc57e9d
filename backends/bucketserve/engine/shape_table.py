"""Named real model shapes for `dummy:<name>` (random weights, benchmarks): the public
config.json fields of each model; vocab stays the real model's."""

# The config.json fields every shape sets, in the order of each row of SHAPE_ROWS.
COLUMNS = (
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "vocab_size", "rope_theta", "rms_norm_eps", "max_position_embeddings",
    "eos_token_id",
)  # fmt: skip
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
TIED = {"tie_word_embeddings": True}

# fmt: off
# name: (the COLUMNS: type, hidden, intermediate, layers, heads, kv heads, vocab, rope theta,
# rms eps, max positions, eos), then the fields only some shapes set
SHAPE_ROWS: dict[str, tuple[tuple, dict]] = {
    "llama-3-8b": (("llama", 4096, 14336, 32, 32, 8, 128256, 500000.0, 1e-05, 8192,
                    [128001, 128009]), {}),
    "llama-3.1-8b": (("llama", 4096, 14336, 32, 32, 8, 128256, 500000.0, 1e-05, 131072,
                      [128001, 128008, 128009]), {"rope_scaling": LLAMA3_ROPE}),
    "llama-2-7b": (("llama", 4096, 11008, 32, 32, 32, 32000, 10000.0, 1e-05, 4096, 2), {}),
    "llama-2-13b": (("llama", 5120, 13824, 40, 40, 40, 32000, 10000.0, 1e-05, 4096, 2), {}),
    "mistral-7b": (("mistral", 4096, 14336, 32, 32, 8, 32768, 1000000.0, 1e-05, 32768, 2), {}),
    "qwen2.5-7b": (("qwen2", 3584, 18944, 28, 28, 4, 152064, 1000000.0, 1e-06, 32768,
                    [151643, 151645]), {}),
    "qwen3-8b": (("qwen3", 4096, 12288, 36, 32, 8, 151936, 1000000.0, 1e-06, 40960,
                  [151645, 151643]), {"head_dim": 128}),
    "smollm2-135m": (("llama", 576, 1536, 30, 9, 3, 49152, 100000.0, 1e-05, 8192, 2), TIED),
    "tiny": (("llama", 64, 128, 2, 4, 2, 49152, 10000.0, 1e-05, 2048, 2), TIED),
    "tiny-qwen3": (("qwen3", 64, 128, 2, 4, 2, 49152, 10000.0, 1e-06, 2048, 2),
                   {"head_dim": 32, **TIED}),
}
# fmt: on

DUMMY_SHAPES: dict[str, dict] = {
    name: {**dict(zip(COLUMNS, row, strict=True)), **extra}
    for name, (row, extra) in SHAPE_ROWS.items()
}
