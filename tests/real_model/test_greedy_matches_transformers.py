"""On the real SmolLM2-135M-Instruct (Q4_1 GGUF), pdserve's engine on the converted folder equals
transformers on the .gguf itself, on prompts of 5 to 1,500 tokens: greedy tokens token for token,
and each token's logprob within LOGPROB_TOL nats of transformers' log-softmax. The converted
tokenizer gives transformers' GGUF tokenizer's ids and chat prompts.

transformers reads each prompt plus the engine's greedy tokens in one forward pass (teacher
forcing): its argmax at every generated position must be the engine's token there. That is
greedy equality (by induction, transformers' own greedy loop would pick the same tokens), at the
cost of one forward per prompt instead of a generation loop.
"""
import pytest
import torch

from tests.checkpoints.tokenizer_texts import CHAT, TEXTS
from tests.real_model.conftest import generation_eos_ids

pytestmark = pytest.mark.real_model

LOGPROB_TOL = 1e-3  # float32 on both sides; what remains is summation order


@pytest.fixture(scope="module")
def transformers_logprobs(engine_outputs, hf_smollm2, prompts) -> list[torch.Tensor]:
    """Per prompt, transformers' log-softmax at each generated position: [MAX_TOKENS, vocab]."""
    logprobs = []
    for prompt, output in zip(prompts, engine_outputs):
        with torch.no_grad():
            logits = hf_smollm2(torch.tensor([prompt + list(output.token_ids)])).logits[0]  # [positions, vocab]
        logprobs.append(torch.log_softmax(logits[len(prompt) - 1:-1].float(), dim=-1))
    return logprobs


def test_greedy_tokens_equal_transformers_token_for_token(engine_outputs, transformers_logprobs, prompts):
    for prompt, output, expected in zip(prompts, engine_outputs, transformers_logprobs):
        assert list(output.token_ids) == expected.argmax(dim=-1).tolist(), f"prompt of {len(prompt)} tokens"


def test_logprobs_equal_transformers_log_softmax(engine_outputs, transformers_logprobs):
    for output, expected in zip(engine_outputs, transformers_logprobs):
        served = torch.tensor([entry.logprob for entry in output.logprobs])
        of_tokens = expected.gather(1, torch.tensor([output.token_ids]).T)[:, 0]
        assert torch.allclose(served, of_tokens, atol=LOGPROB_TOL, rtol=0), (served - of_tokens).abs().max()


def test_token_ids_and_chat_prompts_equal_transformers_gguf_tokenizer(smollm2_dir, smollm2_gguf):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    mine = PreTrainedTokenizerFast.from_pretrained(smollm2_dir)
    theirs = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    for text in TEXTS:
        assert mine(text).input_ids == theirs(text).input_ids, text
    assert (mine.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
            == theirs.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False))


def test_the_converted_folder_ends_generation_at_the_chat_turns_end(smollm2_dir):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(smollm2_dir)
    assert tokenizer.eos_token == "<|im_end|>"
    assert generation_eos_ids(smollm2_dir) == [tokenizer.convert_tokens_to_ids("<|im_end|>")] == [2]
