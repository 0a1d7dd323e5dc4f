"""A CPU decode plan (engine/cpu_decode_plan.py) computes what the model's modules compute, bit for
bit: every decode step's hidden states of an engine running its plan equal those of the same
engine under `enforce_eager`, over batches whose size changes from step to step, for the families
and pools a plan serves, on one thread and on two (where a sequence's attention is shared between
threads); models a plan does not serve run through their modules."""
import pytest
import torch

from pdserve.engine.cpu_decode_plan import DecodePlan
from pdserve.engine.engine_config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.protocol.sampling_params import SamplingParams
from tests.family_configs import gemma2_config, qwen3_sliding_config

PROMPT_LENS = [3, 40, 150]  # 150 + the outputs span several of the attention's 64-key parts
MAX_TOKENS = [8, 14, 20]  # decode batches of 3, then 2, then 1 sequence
ENGINE_OPTIONS = dict(kv_cache_memory_bytes=8 << 20, enable_prefix_caching=False)


def decode_hidden_states(model: str, num_threads: int = 1, **options) -> tuple[LLMEngine, list[torch.Tensor]]:
    """The engine of `options`, and the hidden states its decode-only steps handed to the LM head."""
    engine = LLMEngine(EngineConfig(model=model, **ENGINE_OPTIONS, **options))
    runner = engine.runner
    recorded, compute_logits = [], runner.model.compute_logits

    def record(hidden: torch.Tensor) -> torch.Tensor:
        if len(hidden) == len(engine.scheduler.running) and all(
                r.num_computed_tokens >= r.num_prompt_tokens for r in engine.scheduler.running):
            recorded.append(hidden.clone())
        return compute_logits(hidden)

    runner.model.compute_logits = record
    generator = torch.Generator().manual_seed(0)
    for i, (length, max_tokens) in enumerate(zip(PROMPT_LENS, MAX_TOKENS)):
        prompt = torch.randint(0, engine.model_config.vocab_size, (length,), generator=generator).tolist()
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        for _ in range(100):
            if not engine.has_unfinished_requests():
                break
            engine.step()
    finally:
        torch.set_num_threads(threads)
    assert not engine.has_unfinished_requests()
    return engine, recorded


def assert_plan_equals_modules(model: str, num_threads: int = 1, **options) -> None:
    planned, planned_states = decode_hidden_states(model, num_threads, **options)
    eager, eager_states = decode_hidden_states(model, num_threads, enforce_eager=True, **options)
    assert planned.runner.decode_plan is not None and eager.runner.decode_plan is None
    assert [len(hidden) for hidden in planned_states] == [len(hidden) for hidden in eager_states]
    assert {len(hidden) for hidden in planned_states} == {1, 2, 3}
    for planned_hidden, eager_hidden in zip(planned_states, eager_states):
        assert torch.equal(planned_hidden, eager_hidden)


@pytest.mark.parametrize("spec, dtype, kv_cache_dtype, num_threads", [
    (dict(arch="llama", rope_scaling="llama3"), "float32", "auto", 1),
    (dict(arch="llama", rope_scaling="llama3"), "bfloat16", "auto", 2),
    (dict(arch="llama", rope_scaling="llama3"), "bfloat16", "int8", 1),
    (dict(arch="qwen2", num_heads=4, num_kv_heads=1, tie_word_embeddings=True), "bfloat16", "auto", 1),  # biases
    (dict(arch="mistral", hidden_size=320, num_heads=4, num_kv_heads=2), "float32", "int8", 2),  # head_dim 80
], ids=["llama-fp32", "llama-bf16-2threads", "llama-bf16-int8kv", "qwen2-bf16", "mistral-fp32-int8kv-2threads"])
def test_a_plan_computes_what_the_modules_compute(tiny_model, spec, dtype, kv_cache_dtype, num_threads):
    assert_plan_equals_modules(tiny_model(**spec), num_threads, dtype=dtype, kv_cache_dtype=kv_cache_dtype)


@pytest.mark.parametrize("make_config", [qwen3_sliding_config, gemma2_config])  # q/k norms; norms after attention
def test_a_model_whose_layers_a_plan_does_not_serve_runs_through_its_modules(hf_model, make_config):
    engine = LLMEngine(EngineConfig(model=hf_model(make_config()), **ENGINE_OPTIONS))
    assert not DecodePlan.serves(engine.runner.model, engine.kv_cache)
    assert engine.runner.decode_plan is None
