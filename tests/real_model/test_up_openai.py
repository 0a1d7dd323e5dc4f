"""`pdserve up` with no --model serves SmolLM2-135M-Instruct from the user cache, and the official
openai client gets what the engine computes: a chat answer that names Paris and ends at the chat
turn's end, streamed completions and n=2 sampled choices equal to the offline engine's, and
logprobs within LOGPROB_TOL nats of the engine's."""
import pytest

from pdserve.checkpoints.default_model import DEFAULT_MODEL_ID
from pdserve.protocol.sampling_params import SamplingParams

pytestmark = pytest.mark.real_model

LOGPROB_TOL = 1e-3  # the same float32 forward on both sides; disaggregation only reorders sums
PROMPT = "The three most important inventions of the nineteenth century were"
MAX_TOKENS = 12


def engine_text(llm, **params) -> list[str]:
    (output,) = llm.generate(PROMPT, SamplingParams(max_tokens=MAX_TOKENS, **params), use_tqdm=False)
    return [choice.text for choice in output.outputs]


def test_the_default_model_is_served_under_its_hub_id(openai_client):
    assert [model.id for model in openai_client.models.list()] == [DEFAULT_MODEL_ID]


def test_a_chat_answer_names_paris_and_ends_at_the_end_of_its_turn(openai_client):
    response = openai_client.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=48, temperature=0)
    choice = response.choices[0]
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop" and "<|im_end|>" not in choice.message.content


def test_a_streamed_greedy_completion_equals_the_engine(openai_client, smollm2_llm):
    stream = openai_client.completions.create(model=DEFAULT_MODEL_ID, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                              temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == engine_text(
        smollm2_llm, temperature=0.0)[0]


def test_n_sampled_choices_equal_the_engine_with_the_seeds_vllm_derives(openai_client, smollm2_llm):
    response = openai_client.completions.create(model=DEFAULT_MODEL_ID, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                temperature=0.8, seed=1234, n=2)
    texts = [choice.text for choice in sorted(response.choices, key=lambda choice: choice.index)]
    assert texts == [engine_text(smollm2_llm, temperature=0.8, seed=1234 + j)[0] for j in range(2)]
    assert texts[0] != texts[1]


def test_logprobs_equal_the_engines_within_tolerance(openai_client, smollm2_llm):
    response = openai_client.completions.create(model=DEFAULT_MODEL_ID, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                temperature=0, logprobs=3)
    served = response.choices[0].logprobs
    (output,) = smollm2_llm.generate(PROMPT, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=3),
                                     use_tqdm=False)
    expected = output.outputs[0].logprobs
    assert len(served.token_logprobs) == len(expected)
    for logprob, top, entry in zip(served.token_logprobs, served.top_logprobs, expected):
        assert abs(logprob - entry.logprob) <= LOGPROB_TOL
        assert len(top) == 3 and max(top.values()) == pytest.approx(entry.top_logprobs[0], abs=LOGPROB_TOL)
