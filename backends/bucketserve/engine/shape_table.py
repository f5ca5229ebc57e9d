"""Named real model shapes for `dummy:<name>` (random weights, benchmarks): the public
config.json fields of each model; vocab stays the real model's."""

# fmt: off
DUMMY_SHAPES: dict[str, dict] = {
    "llama-3-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
        rms_norm_eps=1e-05, max_position_embeddings=8192, eos_token_id=[128001, 128009],
    ),
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
        rms_norm_eps=1e-05, max_position_embeddings=131072, eos_token_id=[128001, 128008, 128009],
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
    "llama-2-7b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, rope_theta=10000.0,
        rms_norm_eps=1e-05, max_position_embeddings=4096, eos_token_id=2,
    ),
    "llama-2-13b": dict(
        model_type="llama", hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
        num_attention_heads=40, num_key_value_heads=40, vocab_size=32000, rope_theta=10000.0,
        rms_norm_eps=1e-05, max_position_embeddings=4096, eos_token_id=2,
    ),
    "mistral-7b": dict(
        model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-05, max_position_embeddings=32768, eos_token_id=2,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rope_theta=1000000.0,
        rms_norm_eps=1e-06, max_position_embeddings=32768, eos_token_id=[151643, 151645],
    ),
    "qwen3-8b": dict(
        model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        rope_theta=1000000.0, rms_norm_eps=1e-06, max_position_embeddings=40960,
        eos_token_id=[151645, 151643],
    ),
    "smollm2-135m": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0,
        rms_norm_eps=1e-05, max_position_embeddings=8192, eos_token_id=2,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=49152, rope_theta=10000.0,
        rms_norm_eps=1e-05, max_position_embeddings=2048, eos_token_id=2,
        tie_word_embeddings=True,
    ),
    "tiny-qwen3": dict(
        model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=49152,
        rope_theta=10000.0, rms_norm_eps=1e-06, max_position_embeddings=2048, eos_token_id=2,
        tie_word_embeddings=True,
    ),
}
# fmt: on
