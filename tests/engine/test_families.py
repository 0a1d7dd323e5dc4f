"""Every family's greedy output equals transformers' token for token, on tiny random checkpoints
written by transformers' own classes (so the folders hold the names users download).

Each family runs through `LLM` on one hard schedule: prompts of 1 to 70 tokens all at once, a
token budget of 16 (most prompts prefill in chunks) and a pool of 12 blocks of 8 (the batch
needs several times that, so requests are preempted and recomputed); then second turns that
resend a first turn's prompt and answer, whose prefix the cache serves. float32: two correct
implementations agree on every argmax there. bfloat16 cannot (see test_greedy_matches_hf.py); for
the families whose bfloat16 rounding is their own (expert routing, Gemma's norms) each engine
token must score within BF16_LOGIT_TOL of transformers' best, teacher-forced.
The shapes vary head dims, GQA ratios and tied embeddings across families. Sliding windows are
narrower than most prompts and cross block and chunk edges, and the cached prefixes of the second
turns reach past them.
"""
import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, LlamaConfig, Phi3Config, Qwen3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from pdserve.engine import LLM, SamplingParams
from pdserve.engine.config import ModelConfig
from pdserve.protocol.errors import InvalidModelError
from pdserve.engine.rope import inverse_frequencies
from tests.family_configs import (
    QWEN3_MOE_LAYOUTS,
    SHAPE,
    VOCAB_SIZE,
    gemma2_config,
    gemma3_config,
    mistral_config,
    mixtral_config,
    phi3_longrope_config,
    qwen3_moe_config,
    qwen3_sliding_config,
)

PROMPT_LENGTHS = (1, 3, 17, 29, 45, 70)
BF16_LOGIT_TOL = 1.0  # as in test_greedy_matches_hf.py: a wrong token typically scores ~10 below


def hard_schedule_engine(model_dir: str, dtype: str = "float32") -> LLM:
    return LLM(model_dir, dtype=dtype, block_size=8, num_gpu_blocks=12, max_num_batched_tokens=16, max_num_seqs=8)


def random_cases(prompt_lengths, seed: int = 0) -> list[tuple[list[int], int]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB_SIZE, (n,), generator=generator).tolist(), 6 + i % 5)
            for i, n in enumerate(prompt_lengths)]


def run_schedule(model_dir: str, hf_greedy, prompt_lengths=PROMPT_LENGTHS) -> LLM:
    """Both turns through the engine, each equal to transformers'; returns the engine for its counts."""
    llm = hard_schedule_engine(model_dir)
    first = random_cases(prompt_lengths)
    answers = generate_and_compare(llm, model_dir, hf_greedy, first)
    assert llm.engine.scheduler.num_preemptions > 0
    second = [(prompt + answer + [7, 8, 9], 5) for (prompt, _), answer in zip(first, answers) if len(prompt) > 16]
    generate_and_compare(llm, model_dir, hf_greedy, second)
    assert llm.engine.scheduler.num_prefix_hit_tokens > 0
    assert llm.engine.allocator.num_free_blocks == llm.engine.allocator.num_blocks
    return llm


def generate_and_compare(llm: LLM, model_dir: str, hf_greedy, cases) -> list[list[int]]:
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in cases]
    ours = [list(out.outputs[0].token_ids) for out in llm.generate([p for p, _ in cases], params, use_tqdm=False)]
    expected = hf_greedy(model_dir, cases)
    mismatches = [(i, len(p), e, o) for i, ((p, _), e, o) in enumerate(zip(cases, expected, ours)) if e != o]
    assert not mismatches, f"{len(mismatches)} of {len(cases)} differ; first: {mismatches[0]}"
    return ours


def test_qwen3_normalises_each_head_of_q_and_k(hf_model, hf_greedy):
    # head_dim 48, set apart from hidden / heads as Qwen3 does; GQA 2; tied embeddings
    config = Qwen3Config(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=48, tie_word_embeddings=True, **SHAPE)
    run_schedule(hf_model(config), hf_greedy)


def test_qwen3_slides_the_layers_from_max_window_layers_on(hf_model, hf_greedy):
    model_dir = hf_model(qwen3_sliding_config())
    assert ModelConfig.from_dir(model_dir).parts.sliding_layers == (1,)
    run_schedule(model_dir, hf_greedy)


def test_phi3_loads_its_fused_projections_as_they_are(hf_model, hf_greedy):
    # head_dim 32, no GQA (as Phi-3-mini); untied
    config = Phi3Config(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
                        **SHAPE)
    run_schedule(hf_model(config), hf_greedy)


def test_phi3_longrope_rotates_with_the_long_factors_beyond_the_original_context(hf_model, hf_greedy):
    # Every prompt is longer than the original context, so transformers takes the long factors.
    run_schedule(hf_model(phi3_longrope_config()), hf_greedy, prompt_lengths=(33, 40, 47, 52, 61, 70))


def test_phi3_longrope_keeps_the_short_factors_within_the_original_context(hf_model, hf_greedy):
    llm = LLM(hf_model(phi3_longrope_config()), dtype="float32", block_size=8, num_gpu_blocks=6,
              max_num_batched_tokens=8, max_num_seqs=8, max_model_len=32)
    cases = [(prompt, 32 - len(prompt)) for prompt, _ in random_cases((1, 9, 20, 26))]
    generate_and_compare(llm, llm.engine.config.model, hf_greedy, cases)
    assert llm.engine.scheduler.num_preemptions > 0


def test_a_hub_longrope_config_reads_to_transformers_frequencies():
    """Phi-3-mini-128k's spelling: `rope_scaling` with `type`, the original length at the top level."""
    raw = {"architectures": ["Phi3ForCausalLM"], "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
           "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 131072,
           "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "pad_token_id": 32000,
           "rope_scaling": {"type": "longrope", "short_factor": [1.0 + i / 100 for i in range(48)],
                            "long_factor": [1.0 + i for i in range(48)]}}
    rope = ModelConfig.from_dict(raw).rope
    for max_model_len in (4096, 131072):
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["longrope"](Phi3Config(**raw), None, seq_len=max_model_len)
        assert torch.equal(inverse_frequencies(rope, 96, max_model_len), inv_freq)
        assert rope.attention_factor == attention_factor


def test_mixtral_routes_each_token_to_its_renormalised_top_2_experts(hf_model, hf_greedy):
    run_schedule(hf_model(mixtral_config()), hf_greedy)


@pytest.mark.parametrize("layout", QWEN3_MOE_LAYOUTS)
def test_qwen3_moe_routes_sparse_layers_and_keeps_dense_ones(hf_model, hf_greedy, layout):
    model_dir = hf_model(qwen3_moe_config(**layout))
    moe = ModelConfig.from_dir(model_dir).parts.moe
    assert (moe.num_experts, moe.renormalize) == (8, layout["norm_topk_prob"])
    assert moe.layers == ((0,) if "mlp_only_layers" in layout else (1, 3))
    run_schedule(model_dir, hf_greedy)


def test_mistral_attends_within_its_sliding_window(hf_model, hf_greedy):
    model_dir = hf_model(mistral_config())
    assert ModelConfig.from_dir(model_dir).parts.sliding_layers == (0, 1)
    run_schedule(model_dir, hf_greedy)


def test_gemma2_softcaps_scores_and_logits_and_alternates_sliding_and_global_layers(hf_model, hf_greedy):
    model_dir = hf_model(gemma2_config())
    assert ModelConfig.from_dir(model_dir).parts.sliding_layers == (0, 2)
    llm = run_schedule(model_dir, hf_greedy)
    assert_logprobs_equal_transformers(llm, model_dir)  # greedy alone cannot see the final softcap


def test_gemma3_has_five_sliding_layers_to_one_global_each_with_its_rope(hf_model, hf_greedy):
    model_dir = hf_model(gemma3_config())
    assert ModelConfig.from_dir(model_dir).parts.sliding_layers == (0, 1, 2, 3, 4, 6)
    llm = run_schedule(model_dir, hf_greedy)
    assert_logprobs_equal_transformers(llm, model_dir)  # greedy alone barely sees tanh GELU against exact GELU


def assert_logprobs_equal_transformers(llm: LLM, model_dir: str) -> None:
    """The engine's logprob of each greedy token equals transformers' log-softmax there, teacher-forced."""
    prompts = [prompt for prompt, _ in random_cases((5, 30), seed=5)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for prompt, out in zip(prompts, llm.generate(prompts, params, use_tqdm=False)):
        tokens = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]  # [6, vocab]
        expected = logits.log_softmax(dim=-1)[torch.arange(len(tokens)), tokens]
        ours = torch.tensor([step.logprob for step in out.outputs[0].logprobs])
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("make_config", [mixtral_config, lambda: qwen3_moe_config(**QWEN3_MOE_LAYOUTS[0]),
                                         gemma3_config], ids=["mixtral", "qwen3_moe", "gemma3"])
def test_bfloat16_greedy_is_transformers_argmax_within_tolerance(hf_model, make_config):
    model_dir = hf_model(make_config())
    llm = hard_schedule_engine(model_dir, "bfloat16")
    cases = random_cases(PROMPT_LENGTHS)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in cases]
    outputs = llm.generate([prompt for prompt, _ in cases], params, use_tqdm=False)
    assert llm.engine.scheduler.num_preemptions > 0
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    for (prompt, _), out in zip(cases, outputs):
        tokens = list(out.outputs[0].token_ids)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()  # [len, vocab]
        shortfall = logits.max(dim=-1).values - logits[torch.arange(len(tokens)), tokens]
        assert shortfall.max() <= BF16_LOGIT_TOL, f"prompt of {len(prompt)}: shortfalls {shortfall.tolist()}"


@pytest.mark.parametrize("config_class, raw, sliding_layers", [
    (Gemma2Config, {"architectures": ["Gemma2ForCausalLM"], "sliding_window": 4096}, (0, 2, 4)),
    (Gemma3TextConfig, {"architectures": ["Gemma3ForCausalLM"], "sliding_window": 512, "sliding_window_pattern": 3,
                        "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear",
                                                                                          "factor": 8.0}},
     (0, 1, 3, 4)),
])
def test_hub_configs_without_layer_types_read_as_transformers_reads_them(config_class, raw, sliding_layers):
    raw = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 8192,
           **raw}
    ours, theirs = ModelConfig.from_dict(raw), config_class(**raw)
    assert ours.parts.sliding_layers == sliding_layers
    assert sliding_layers == tuple(i for i, kind in enumerate(theirs.layer_types) if kind == "sliding_attention")
    if config_class is Gemma3TextConfig:
        full, local = theirs.rope_parameters["full_attention"], theirs.rope_parameters["sliding_attention"]
        assert (ours.rope.theta, ours.rope.rope_type, ours.rope.factor) == (full["rope_theta"], "linear", 8.0)
        assert (ours.parts.local_rope.theta, ours.parts.local_rope.rope_type) == (local["rope_theta"], "default")


def test_an_unsupported_architecture_is_refused_with_the_supported_list():
    with pytest.raises(InvalidModelError, match="supported: LlamaForCausalLM, .*Gemma3ForCausalLM"):
        ModelConfig.from_dict({"architectures": ["GPT2LMHeadModel"]})


def test_phi3_reads_su_and_yarn_as_longrope_with_its_original_context_at_the_top_level():
    """Phi-3's own rope spelling (its row in engine/families.py): older names of LongRoPE, and an
    original context that defaults to 4096 and wins over the rope parameters'."""
    for old_name in ("su", "yarn"):
        raw = {"architectures": ["Phi3ForCausalLM"], "vocab_size": 32064, "hidden_size": 3072,
               "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32,
               "max_position_embeddings": 131072, "rope_theta": 10000.0, "pad_token_id": 32000,
               "rope_scaling": {"type": old_name, "short_factor": [1.0 + i / 100 for i in range(48)],
                                "long_factor": [1.0 + i for i in range(48)], "original_max_position_embeddings": 8192}}
        rope = ModelConfig.from_dict(raw).rope
        assert (rope.rope_type, rope.original_max_position_embeddings) == ("longrope", 4096)
        theirs = Phi3Config(**raw)
        for max_model_len in (4096, 131072):
            inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["longrope"](theirs, None, seq_len=max_model_len)
            assert torch.equal(inverse_frequencies(rope, 96, max_model_len), inv_freq)
            assert rope.attention_factor == attention_factor


@pytest.mark.parametrize("config_class, architecture", [(Gemma2Config, "Gemma2ForCausalLM"),
                                                        (Gemma3TextConfig, "Gemma3ForCausalLM")])
def test_a_gemma_config_that_names_no_activation_or_tying_reads_as_transformers_defaults_them(config_class,
                                                                                              architecture):
    raw = {"architectures": [architecture], "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
           "max_position_embeddings": 8192}
    ours, theirs = ModelConfig.from_dict(raw), config_class(**raw)
    assert (theirs.hidden_activation, ours.parts.activation) == ("gelu_pytorch_tanh", "gelu_tanh")
    assert ours.tie_word_embeddings == theirs.tie_word_embeddings is True
    assert ours.parts.norm_adds_one and ours.parts.post_norms and ours.parts.scale_embeddings


def test_a_family_whose_checkpoints_come_fused_refuses_one_kept_apart(hf_model, tmp_path):
    """Phi-3's row says its qkv_proj and gate_up_proj come fused: a Llama checkpoint's separate
    q/k/v and gate/up, read as Phi-3's, are tensors a Phi-3 does not have."""
    import json
    import shutil

    from pdserve.engine.weights import load_model

    llama_dir = hf_model(LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                     num_key_value_heads=4, **SHAPE))
    phi3_dir = tmp_path / "phi3"
    shutil.copytree(llama_dir, phi3_dir)
    raw = json.loads((phi3_dir / "config.json").read_text())
    (phi3_dir / "config.json").write_text(json.dumps({**raw, "architectures": ["Phi3ForCausalLM"]}))
    load_model(llama_dir, ModelConfig.from_dir(llama_dir), torch.float32, torch.device("cpu"))
    with pytest.raises(InvalidModelError, match="does not match Phi3ForCausalLM: .*q_proj"):
        load_model(phi3_dir, ModelConfig.from_dir(phi3_dir), torch.float32, torch.device("cpu"))
