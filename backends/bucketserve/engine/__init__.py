"""Inference engine: Llama-family model, paged KV pool, attention backends, sampler, runner.

Entry points (import from the modules; this package imports nothing so that the torch-free
bookkeeping modules stay torch-free):
  config.EngineConfig, runner.ModelRunner      one model instance + its exportable KV pool
  block_manager.BlockManager, sequence.Sequence block ids and per-request token state
  sampling_params.SamplingParams               per-request sampling settings
  loader.resolve_model / is_dummy / model_config_for
  llm_engine.LLMEngine                         offline generate() (tests, benchmarks)
"""
