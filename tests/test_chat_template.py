"""The built-in Qwen3 ChatML template: exact prompt strings and the errors for malformed messages."""

import pytest

from core.tokenizer import load_tokenizer, render_chatml

SYSTEM_USER = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
]
SYSTEM_USER_PROMPT = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
)


def test_generation_prompt_with_thinking_on_opens_an_assistant_turn():
    assert render_chatml(SYSTEM_USER) == SYSTEM_USER_PROMPT + "<|im_start|>assistant\n"


def test_generation_prompt_with_thinking_off_adds_an_empty_think_block():
    assert render_chatml(SYSTEM_USER, enable_thinking=False) == (
        SYSTEM_USER_PROMPT + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_without_generation_prompt_only_the_turns_are_rendered():
    assert render_chatml(SYSTEM_USER, add_generation_prompt=False) == SYSTEM_USER_PROMPT
    no_thinking = render_chatml(SYSTEM_USER, add_generation_prompt=False, enable_thinking=False)
    assert no_thinking == SYSTEM_USER_PROMPT


def test_earlier_assistant_turns_lose_their_think_block():
    messages = [
        *SYSTEM_USER,
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    assert render_chatml(messages, enable_thinking=False) == (
        SYSTEM_USER_PROMPT
        + "<|im_start|>assistant\n4<|im_end|>\n"
        + "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_earlier_assistant_reasoning_content_field_is_dropped_too():
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "bye"},
    ]
    assert render_chatml(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
        "<|im_start|>user\nbye<|im_end|>\n"
    )


def test_assistant_turns_after_the_last_query_keep_their_reasoning():
    # A tool loop: the model's reasoning since the user's question stays in the prompt (as in Qwen3).
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "\nNeed the tool.\n"},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "21C"},
    ]
    assert render_chatml(messages) == (
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\nLet me look.<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n21C\n</tool_response>"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_final_assistant_turn_gets_an_empty_think_block():
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert render_chatml(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nhello<|im_end|>\n"
    )


def test_text_parts_are_joined_with_newlines():
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    messages = [{"role": "user", "content": parts}]
    assert render_chatml(messages) == "<|im_start|>user\none\ntwo<|im_end|>\n<|im_start|>assistant\n"


def test_unknown_role_names_the_role_and_index():
    with pytest.raises(ValueError, match=r"messages\[1\] has unknown role 'developer'"):
        render_chatml([{"role": "user", "content": "x"}, {"role": "developer", "content": "y"}])


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (42, r"messages\[0\]\.content"),
        ([{"type": "image_url", "image_url": {"url": "x"}}], r"messages\[0\]\.content\[0\]\.type"),
        ([{"type": "text", "text": None}], r"messages\[0\]\.content\[0\]\.text"),
        (["bare string"], r"messages\[0\]\.content\[0\]"),
        (None, r"messages\[0\]\.content"),
    ],
)
def test_malformed_content_names_the_field(content, field):
    with pytest.raises(ValueError, match=field):
        render_chatml([{"role": "user", "content": content}])


def test_malformed_tool_calls_name_the_message():
    messages = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]}]
    with pytest.raises(ValueError, match=r"messages\[0\]\.tool_calls\[0\]"):
        render_chatml(messages)


def test_rendered_prompt_encodes_control_tokens_to_special_ids():
    ids = load_tokenizer(None).encode(render_chatml(SYSTEM_USER, enable_thinking=False))
    assert ids[0] == 151644 and ids.count(151645) == 2
    assert ids[-7:] == [151644, 77091, 198, 151667, 271, 151668, 271]


def test_continue_final_message_leaves_the_assistants_answer_open():
    chat = [*SYSTEM_USER, {"role": "assistant", "content": "The answer is"}]
    closed = render_chatml(chat, add_generation_prompt=False)
    assert closed.endswith("The answer is<|im_end|>\n")
    opened = render_chatml(chat, add_generation_prompt=False, continue_final_message=True)
    assert opened == closed.removesuffix("<|im_end|>\n") and opened.endswith("\n\nThe answer is")
    with pytest.raises(ValueError, match="cannot both be true"):
        render_chatml(chat, add_generation_prompt=True, continue_final_message=True)
    with pytest.raises(ValueError, match="last message to be the assistant's"):
        render_chatml(SYSTEM_USER, add_generation_prompt=False, continue_final_message=True)
