"""The model configs ``tokweight plan --model NAME`` knows by name: the shapes of the public config.json files of
the Qwen2.5 and Llama checkpoints their names give (no weights), and the built-in GPT at the tiny base preset's
size. A config without ``model_type`` is the built-in GPT's (``pipeline/models/gpt.py`` ``ModelConfig`` fields); one
with it is a Hugging Face config, read by transformers' ``AutoConfig``."""

from __future__ import annotations

MODELS: dict[str, dict] = {
    "gpt-tiny": dict(vocab_size=32, block_size=64, n_layer=2, n_head=2, d_model=32),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True),
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192)),
}
