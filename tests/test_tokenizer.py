"""The Tokenizer interface: the built-in Qwen3 vocabulary, a Hugging Face directory, load_tokenizer."""

import base64
import json

import pytest
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as RustTokenizer

from core.tokenizer import HFTokenizer, QwenVocabTokenizer, TokenizerError, load_tokenizer
from core.tokenizer.qwen_vocab import QWEN3_SPECIAL_TOKENS, load_bpe_ranks, qwen_rank_file
from procs.tokenizer_queries import tokenizer_info

ROUND_TRIP_TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog. It's 3:45 p.m., isn't it?",
    "chinese": "你好,世界!今天天气很好,我们去公园散步吧。",
    "emoji": "Family 👨\u200d👩\u200d👧\u200d👦, astronaut 🧑🏽\u200d🚀, flag 🇯🇵, melting 🫠!",
    "code": 'def square(x: int) -> int:\n    """平方."""\n\treturn x ** 2  # ok\n\n\nprint(square(12))\r\n',
    "whitespace": "  leading and trailing  \n\n\n   ",
}

CORPUS = [
    "hello world, the quick brown fox",
    "你好 世界 今天",
    "def f(x):\n    return x * 2",
    "emoji 😀 🎉 and more text here",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def write_byte_level_tokenizer(directory, chat_template=None):
    """A tiny Qwen-shaped tokenizer: NFC, byte-level BPE, ChatML specials, <think> as plain added tokens."""
    tokenizer = RustTokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 5, trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "clean_up_tokenization_spaces": False}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return load_tokenizer(str(write_byte_level_tokenizer(tmp_path_factory.mktemp("hf"), CHAT_TEMPLATE)))


@pytest.fixture(scope="module")
def hf_without_template(tmp_path_factory):
    return load_tokenizer(str(write_byte_level_tokenizer(tmp_path_factory.mktemp("hf_plain"))))


def rank_file_entries(ranks):
    """The bytes of the given ranks, read straight from the qwen.tiktoken lines."""
    wanted = set(ranks)
    found = {}
    for line in qwen_rank_file().read_bytes().splitlines():
        token_b64, rank = line.split()
        if int(rank) in wanted:
            found[int(rank)] = base64.b64decode(token_b64)
    return found


def test_builtin_vocab_encodes_hello_world_to_qwen3_ids(qwen):
    assert isinstance(qwen, QwenVocabTokenizer)
    assert qwen.encode("Hello, 世界!") == [9707, 11, 220, 99489, 0]


def test_builtin_ids_are_the_rank_file_entries(qwen):
    entries = rank_file_entries([9707, 11, 220, 99489, 0])
    assert entries == {9707: b"Hello", 11: b",", 220: b" ", 99489: "世界".encode(), 0: b"!"}
    code = "def main():\n    return 0"
    ids = qwen.encode(code)
    by_rank = rank_file_entries(ids)
    assert b"".join(by_rank[i] for i in ids) == code.encode()
    assert [qwen.token_bytes(i) for i in ids] == [by_rank[i] for i in ids]


def test_builtin_special_tokens_have_qwen3_ids(qwen):
    assert QWEN3_SPECIAL_TOKENS[0] == "<|endoftext|>" and QWEN3_SPECIAL_TOKENS[-1] == "</think>"
    for offset, text in enumerate(QWEN3_SPECIAL_TOKENS):
        assert qwen.encode(text) == [151643 + offset], text
        assert qwen.decode([151643 + offset]) == text
    assert qwen.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    assert qwen.eos_token_ids == (151645, 151643)
    assert qwen.vocab_size == 151669


def test_skip_special_tokens_keeps_think_and_tool_call_tokens(qwen):
    # Qwen3's tokenizer.json marks <think>, <tool_call>, ... as non-special added tokens.
    kept = "assistant\n<think>hm</think><tool_call>x</tool_call>"
    ids = qwen.encode(f"<|im_start|>{kept}<|im_end|><|endoftext|>")
    assert qwen.decode(ids, skip_special_tokens=True) == kept
    assert {151643, 151644, 151645, 151656} <= qwen.special_token_ids
    assert not {151657, 151667, 151668} & qwen.special_token_ids


@pytest.mark.parametrize("name", sorted(ROUND_TRIP_TEXTS))
def test_builtin_round_trip(qwen, name):
    text = ROUND_TRIP_TEXTS[name]
    assert qwen.decode(qwen.encode(text)) == text


def test_builtin_splits_a_zwj_emoji_into_several_tokens(qwen):
    ids = qwen.encode("🧑🏽\u200d🚀")
    assert len(ids) > 3
    assert any(not _is_whole_utf8(qwen.token_bytes(i)) for i in ids)  # a char cut across tokens


def _is_whole_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_builtin_encode_normalizes_to_nfc(qwen):
    assert qwen.encode("cafe\u0301") == qwen.encode("caf\u00e9")


def test_builtin_padding_ids_decode_to_nothing(qwen):
    # Qwen3's embedding has 151936 rows; ids past 151668 have no text.
    assert qwen.decode([9707, 151700, 151935]) == "Hello"
    assert qwen.token_bytes(151700) == b""
    with pytest.raises(TokenizerError, match="-1"):
        qwen.decode([-1])


@pytest.mark.parametrize("name", sorted(ROUND_TRIP_TEXTS))
def test_hf_directory_round_trip(hf, name):
    text = ROUND_TRIP_TEXTS[name]
    assert hf.decode(hf.encode(text)) == text


def test_hf_directory_special_and_eos_ids(hf):
    assert isinstance(hf, HFTokenizer)
    im_start, im_end, endoftext = (hf.encode(t)[0] for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
    assert hf.eos_token_ids == (im_end, endoftext)
    assert {im_start, im_end, endoftext} <= hf.special_token_ids
    assert hf.encode("<think>")[0] not in hf.special_token_ids
    assert hf.has_token_bytes
    assert hf.vocab_size == max(hf.encode("</think>")) + 1


def test_hf_token_bytes_rebuild_the_text(hf):
    text = ROUND_TRIP_TEXTS["emoji"] + "<|im_end|><think>"
    ids = hf.encode(text)
    assert b"".join(hf.token_bytes(i) for i in ids).decode() == text


def test_hf_directory_chat_template_is_used_with_enable_thinking(hf):
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert hf.apply_chat_template(messages, enable_thinking=False) == (
        "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    no_prompt = hf.apply_chat_template(messages, add_generation_prompt=False)
    assert no_prompt == "<|im_start|>user\na\nb<|im_end|>\n"


def test_hf_directory_template_gets_tool_calls_as_sent_and_flat_contents(hf):
    # A model's own template renders tool calls its own way; only the content is flattened for it.
    messages = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}]
    assert (
        hf.apply_chat_template(messages, add_generation_prompt=False) == "<|im_start|>assistant\n<|im_end|>\n"
    )
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\]\.type"):
        hf.apply_chat_template([{"role": "user", "content": [{"type": "image_url"}]}])


def test_hf_directory_without_template_uses_the_builtin_one(hf_without_template):
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\nr\n</think>\n\nanswer"},
        {"role": "user", "content": "q2"},
    ]
    assert hf_without_template.apply_chat_template(messages) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nanswer<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n"
    )


def test_load_tokenizer_uses_builtin_vocab_for_a_directory_without_tokenizer_files(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    tokenizer = load_tokenizer(str(tmp_path))
    assert isinstance(tokenizer, QwenVocabTokenizer)


def test_load_tokenizer_names_a_missing_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(TokenizerError, match=str(missing)):
        load_tokenizer(str(missing))


def test_load_tokenizer_names_the_directory_of_an_unreadable_tokenizer(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{ this is not json")
    with pytest.raises(TokenizerError, match=str(tmp_path)):
        load_tokenizer(str(tmp_path))


def test_rank_file_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "qwen.tiktoken"
    bad.write_bytes(b"IQ== 0\nnot-a-pair\n")
    with pytest.raises(TokenizerError, match=rf"{bad}:2"):
        load_bpe_ranks(bad)
    bad.write_bytes(b"IQ== 0\n\nIg== 1\nI*== 2\n")  # not base64 on line 4, after an empty line
    with pytest.raises(TokenizerError, match=rf"{bad}:4 is not a 'base64 rank' pair: b'I\*== 2'"):
        load_bpe_ranks(bad)
    with pytest.raises(TokenizerError, match="cannot read"):
        load_bpe_ranks(tmp_path / "missing.tiktoken")


def test_hf_directory_template_gets_the_tools(hf):
    template = hf._hf.chat_template
    hf._hf.chat_template = "{% for t in tools %}{{ t.function.name }};{% endfor %}{{ messages[0].content }}"
    try:
        tools = [{"type": "function", "function": {"name": name}} for name in "ab"]
        assert hf.apply_chat_template([{"role": "user", "content": "q"}], tools=tools) == "a;b;q"
    finally:
        hf._hf.chat_template = template


def test_tokenizer_info_has_a_checkpoints_jinja_template_and_special_tokens(hf, hf_without_template, qwen):
    info = tokenizer_info(hf, max_model_len=4096, vocab_size=512)
    assert info["chat_template"] == CHAT_TEMPLATE and info["eos_token"] == "<|im_end|>"
    assert info["model_max_length"] == 4096 and info["tokenizer_class"] == "HFTokenizer"
    assert tokenizer_info(hf_without_template, 4096, 512)["chat_template"] is None
    built_in = tokenizer_info(qwen, 4096, 151936)
    assert built_in["chat_template"] is None and built_in["pad_token"] == "<|endoftext|>"


def test_a_checkpoints_template_continues_the_final_message_as_transformers_does(hf):
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I am"}]
    text = hf.apply_chat_template(chat, add_generation_prompt=False, continue_final_message=True)
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, I am"
    with pytest.raises(ValueError, match="rejected the messages"):
        hf.apply_chat_template(chat, add_generation_prompt=True, continue_final_message=True)
