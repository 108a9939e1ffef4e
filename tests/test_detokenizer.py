"""IncrementalDetokenizer: streamed pieces join to the full decode and never split a character."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from core.tokenizer import IncrementalDetokenizer, Tokenizer, load_tokenizer

EMOJI_TEXT = "Hi 👋! Family 👨\u200d👩\u200d👧\u200d👦, astronaut 🧑🏽\u200d🚀, flag 🇯🇵 and 🫠."
TEXT_PIECES = [
    *"abc xyz\n\t.,!?'",
    *"世界你好天气",
    "😀",
    "🫠",
    "🧑🏽",
    "\u200d",
    "🚀",
    "é",
    "ß",
    "ü",
    "def ",
    "    ",
]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def byte_level_hf(tmp_path_factory):
    """A tiny byte-level BPE directory, the shape of Qwen3's tokenizer.json."""
    directory = tmp_path_factory.mktemp("byte_level")
    tokenizer = RustTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=350,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["hello world 世界 😀 the quick brown fox"] * 5, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"clean_up_tokenization_spaces": False}))
    return load_tokenizer(str(directory))


@pytest.fixture(scope="module")
def sentencepiece_like_hf(tmp_path_factory):
    """A Llama-style BPE (▁ for spaces, byte fallback, leading space stripped): not byte-level."""
    directory = tmp_path_factory.mktemp("metaspace")
    vocab = {"<unk>": 0, "</s>": 1, **{f"<0x{b:02X}>": 2 + b for b in range(256)}}
    for piece in [*"▁abcdefghijklmnopqrstuvwxyz", "▁t", "he", "▁the"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he")]
    tokenizer = RustTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(["</s>"])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "</s>", "clean_up_tokenization_spaces": False})
    )
    return load_tokenizer(str(directory))


def stream(tokenizer, ids, chunk_sizes=(1,), skip_special_tokens=False):
    """Feed ids in chunks cycling through chunk_sizes; returns every piece, the final flush last."""
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    pieces, start, turn = [], 0, 0
    while start < len(ids):
        size = chunk_sizes[turn % len(chunk_sizes)]
        pieces.append(detokenizer.push(ids[start : start + size]))
        start, turn = start + size, turn + 1
    pieces.append(detokenizer.finish())
    return pieces


def test_incremental_decode_equals_full_decode_on_emoji(qwen):
    ids = qwen.encode(EMOJI_TEXT)
    assert len(ids) > len(EMOJI_TEXT.split())  # emoji really are cut across tokens
    pieces = stream(qwen, ids)
    assert "".join(pieces) == qwen.decode(ids) == EMOJI_TEXT
    assert not any("\ufffd" in piece for piece in pieces)


def test_half_a_character_is_held_back_until_its_last_byte(qwen):
    ids = qwen.encode("🫠")
    assert len(ids) > 1
    detokenizer = IncrementalDetokenizer(qwen)
    assert [detokenizer.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detokenizer.push(ids[-1:]) == "🫠"


def test_an_unfinished_character_at_the_end_comes_out_as_decode_does(qwen):
    ids = qwen.encode("ok 🫠")[:-1]
    pieces = stream(qwen, ids)
    assert pieces[-1] == "\ufffd"
    assert "".join(pieces) == qwen.decode(ids)


@FAST
@given(text=st.lists(st.sampled_from(TEXT_PIECES), max_size=40).map("".join), data=st.data())
def test_incremental_decode_equals_full_decode_in_random_chunks(qwen, text, data):
    ids = qwen.encode(text)
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    pieces = stream(qwen, ids, sizes)
    assert "".join(pieces) == qwen.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)


@FAST
@given(
    ids=st.lists(
        st.one_of(st.integers(0, 151668), st.sampled_from([151644, 151645, 151667, 94, 9909])), max_size=30
    ),
    skip=st.booleans(),
)
def test_arbitrary_ids_stream_to_the_full_decode(qwen, ids, skip):
    # Arbitrary ids include lone continuation bytes: the U+FFFDs must land where decode puts them.
    assert "".join(stream(qwen, ids, (1, 3), skip_special_tokens=skip)) == qwen.decode(ids, skip)


def test_skip_special_tokens_drops_control_tokens_but_keeps_think(qwen):
    ids = qwen.encode("<|im_start|>assistant\n<think>\nhm\n</think>\n\n答案 🎉<|im_end|>")
    skipped = "".join(stream(qwen, ids, skip_special_tokens=True))
    assert skipped == "assistant\n<think>\nhm\n</think>\n\n答案 🎉"
    assert "".join(stream(qwen, ids)).endswith("🎉<|im_end|>")


def test_byte_stream_never_redecodes_history(qwen):
    class NoDecode(Tokenizer):
        """The built-in vocabulary, except that decode() fails: the stream must use bytes only."""

        vocab_size, eos_token_ids = qwen.vocab_size, qwen.eos_token_ids
        special_token_ids, has_token_bytes = qwen.special_token_ids, True
        encode = staticmethod(qwen.encode)
        token_bytes = staticmethod(qwen.token_bytes)

        def decode(self, ids, skip_special_tokens=False):
            raise AssertionError("decode called")

    ids = qwen.encode(EMOJI_TEXT * 3)
    assert "".join(stream(NoDecode(), ids)) == EMOJI_TEXT * 3


def test_hf_byte_level_tokenizer_streams_through_token_bytes(byte_level_hf):
    assert byte_level_hf.has_token_bytes
    text = "hello 世界 😀 " + EMOJI_TEXT
    ids = byte_level_hf.encode(text)
    pieces = stream(byte_level_hf, ids)
    assert "".join(pieces) == byte_level_hf.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)


@FAST
@given(data=st.data(), skip=st.booleans())
def test_hf_token_bytes_agree_with_hf_decode_on_arbitrary_ids(byte_level_hf, data, skip):
    ids = data.draw(st.lists(st.integers(0, byte_level_hf.vocab_size - 1), max_size=30))
    streamed = "".join(stream(byte_level_hf, ids, (2, 1), skip_special_tokens=skip))
    assert streamed == byte_level_hf.decode(ids, skip)


def test_non_byte_level_tokenizer_falls_back_to_windowed_redecode(sentencepiece_like_hf):
    tokenizer = sentencepiece_like_hf
    assert not tokenizer.has_token_bytes
    text = "the cat 😀 sat 世 on the mat"
    ids = tokenizer.encode(text) + tokenizer.encode("</s>")
    for sizes in [(1,), (2, 3), (len(ids),)]:
        pieces = stream(tokenizer, ids, sizes)
        assert "".join(pieces) == tokenizer.decode(ids) == text + "</s>"
        assert not any("\ufffd" in piece for piece in pieces)
    assert "".join(stream(tokenizer, ids, skip_special_tokens=True)) == text


def test_push_after_finish_is_an_error(qwen):
    detokenizer = IncrementalDetokenizer(qwen)
    detokenizer.push([9707])
    detokenizer.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        detokenizer.push([11])
