"""Tools in the prompt: the chat template renders them when it can; when it ignores them (the tiny
model's ChatML template does, as SmolLM2's does) a system message lists them and shows the
parser's layout, and earlier calls are written in that layout."""
import json

import pytest

from pdserve.gateway.front.openai_protocol import parse_chat_request
from pdserve.gateway.front.tokenization import PromptBuilder
from pdserve.gateway.front.tool_parsers import TOOL_CALL_PARSERS
from pdserve.protocol.tokenizer import load_tokenizer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}
USER = {"role": "user", "content": "Weather in Paris?"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
SECOND_TURN = [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
               {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]
TOOLS_TEMPLATE = (  # renders its tools, as Hermes-style templates do
    "{% if tools %}<|im_start|>system\nTOOLS{% for tool in tools %} {{ tool.function.name }}{% endfor %}<|im_end|>\n"
    "{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def model_dir(tiny_model):
    return tiny_model(num_layers=1)


def rendered(model_dir, messages, tokenizer=None, parser="hermes", **body) -> str:
    tokenizer = tokenizer or load_tokenizer(model_dir)
    prompts = PromptBuilder(tokenizer, model_dir, len(tokenizer), 4096)
    parsed = parse_chat_request({"messages": messages, **body}, "m", 4096, TOOL_CALL_PARSERS[parser])
    return tokenizer.decode(prompts.prompt_ids(parsed.generate_input))


def test_a_template_that_ignores_tools_gets_them_in_a_system_message(model_dir):
    prompt = rendered(model_dir, [USER], tools=[WEATHER])

    system = prompt.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]
    assert json.dumps(WEATHER) in system
    assert '<tool_call>\n{"name": <function-name>, "arguments": <arguments-json-object>}\n</tool_call>' in system
    assert prompt.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_the_fallback_shows_the_servers_parser_layout(model_dir):
    prompt = rendered(model_dir, [USER], parser="mistral", tools=[WEATHER])

    assert "[TOOL_CALLS][{\"name\": <function-name>" in prompt and "<tool_call>" not in prompt


def test_the_fallback_joins_the_conversations_own_system_message(model_dir):
    prompt = rendered(model_dir, [{"role": "system", "content": "Be brief."}, USER], tools=[WEATHER])

    assert prompt.count("<|im_start|>system") == 1
    assert prompt.split("<|im_start|>system\n", 1)[1].startswith("Be brief.\n\nYou may call")


def test_with_tool_choice_none_the_template_alone_decides(model_dir):
    assert rendered(model_dir, [USER], tools=[WEATHER], tool_choice="none") == rendered(model_dir, [USER])


def test_a_template_that_renders_tools_gets_no_fallback(model_dir):
    tokenizer = load_tokenizer(model_dir)  # a fresh one, whose template this test replaces
    tokenizer.chat_template = TOOLS_TEMPLATE

    prompt = rendered(model_dir, [USER], tokenizer=tokenizer, tools=[WEATHER])

    assert prompt.startswith("<|im_start|>system\nTOOLS get_weather<|im_end|>\n<|im_start|>user")
    assert "You may call" not in prompt


def test_an_agent_loops_second_turn_shows_the_call_and_its_result(model_dir):
    prompt = rendered(model_dir, SECOND_TURN, tools=[WEATHER])

    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>tool\n22 C<|im_end|>\n<|im_start|>assistant\n') in prompt
