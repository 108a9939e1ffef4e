"""The wire codec: envelopes round-trip exactly, and every kind of bad input names what is wrong."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import orjson
import pytest

from ipc.codec import CodecError, decode, encode, message, message_type


class Finish(enum.Enum):
    STOP = "stop"
    LENGTH = "length"


@message
@dataclass(frozen=True)
class Token:
    token_id: int
    logprob: float | None


@message
@dataclass(frozen=True)
class Output:
    request_id: str
    tokens: tuple[Token, ...]
    finish: Finish | None
    top_k: tuple[int, float]  # a fixed-shape tuple
    stop: list[str]
    meta: dict[str, int] = field(default_factory=dict)


@message("custom.name")
@dataclass(frozen=True)
class Renamed:
    n: int


@message
@dataclass(frozen=True)
class Positive:
    n: int

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ValueError(f"n must be positive, got {self.n}")


@message
@dataclass(frozen=True)
class Ids:
    ids: list[int]
    scale: float


@message
@dataclass(frozen=True)
class Scalars:
    ints: tuple[int, ...]
    floats: list[float]


def _output() -> Output:
    return Output(
        request_id="req-1",
        tokens=(Token(5, -0.25), Token(7, None)),
        finish=Finish.STOP,
        top_k=(3, 0.5),
        stop=["</s>"],
        meta={"cached": 4},
    )


def test_nested_dataclasses_tuples_none_and_enums_round_trip():
    msg = _output()
    got = decode(encode(msg))
    assert got == msg
    assert isinstance(got.tokens, tuple) and isinstance(got.tokens[0], Token)
    assert isinstance(got.top_k, tuple) and got.finish is Finish.STOP


def test_encoding_is_a_plain_json_envelope_not_pickle():
    data = encode(_output())
    doc = orjson.loads(data)  # valid JSON, so nothing was pickled
    assert doc["type"] == "Output"
    assert doc["body"]["tokens"][1] == {"token_id": 7, "logprob": None}
    assert not data.startswith(b"\x80")  # a pickle protocol header


def test_explicit_type_name_is_used_on_the_wire():
    assert orjson.loads(encode(Renamed(3)))["type"] == "custom.name"
    assert message_type("custom.name") is Renamed
    assert decode(encode(Renamed(3))) == Renamed(3)


def test_integral_float_decodes_as_float():
    got = decode(b'{"type":"Ids","body":{"ids":[1],"scale":2}}')
    assert got.scale == 2.0 and isinstance(got.scale, float)


def test_numpy_arrays_encode_as_lists_and_decode_as_lists():
    got = decode(encode(Ids(np.arange(3, dtype=np.int32), np.float32(0.5))))
    assert got == Ids([0, 1, 2], 0.5)
    assert type(got.ids) is list


def test_unknown_type_names_the_type():
    with pytest.raises(CodecError, match=r"unknown message type 'Nope'"):
        decode(b'{"type":"Nope","body":{}}')


def test_malformed_bytes_say_not_json():
    with pytest.raises(CodecError, match=r"not valid JSON"):
        decode(b"\x80\x04garbage")


def test_envelope_without_type_and_body_is_rejected():
    with pytest.raises(CodecError, match=r"keys 'type' and 'body'"):
        decode(b'{"kind":"Token"}')


def test_missing_field_names_type_and_field():
    with pytest.raises(CodecError, match=r"message Token: missing field\(s\) 'logprob'"):
        decode(b'{"type":"Token","body":{"token_id":1}}')


def test_missing_nested_field_names_its_path():
    body = b'{"request_id":"r","tokens":[{"token_id":1}],"finish":null,"top_k":[1,0.5],"stop":[]}'
    with pytest.raises(CodecError, match=r"message Output: missing field\(s\) 'tokens\[0\]\.logprob'"):
        decode(b'{"type":"Output","body":' + body + b"}")


def test_field_with_default_may_be_missing():
    body = b'{"request_id":"r","tokens":[],"finish":null,"top_k":[1,0.5],"stop":[]}'
    assert decode(b'{"type":"Output","body":' + body + b"}").meta == {}


def test_extra_field_is_rejected():
    with pytest.raises(CodecError, match=r"message Token: unknown field\(s\) 'extra'"):
        decode(b'{"type":"Token","body":{"token_id":1,"logprob":null,"extra":2}}')


def test_wrong_type_names_the_field_path_and_value():
    doc = orjson.loads(encode(_output()))
    doc["body"]["tokens"][1]["token_id"] = "seven"
    with pytest.raises(
        CodecError, match=r"message Output field 'tokens\[1\]\.token_id': expected int, got str"
    ):
        decode(orjson.dumps(doc))


def test_bool_is_not_an_int():
    with pytest.raises(CodecError, match=r"field 'n': expected int, got bool"):
        decode(b'{"type":"custom.name","body":{"n":true}}')


def test_long_scalar_lists_keep_their_checks():
    """A long array of one scalar type takes the one-pass check; a stray item still gets its path."""
    ids = list(range(5000))
    assert decode(encode(Ids(ids, 1.0))).ids == ids
    mixed = Scalars(ints=(1, 2, 3), floats=[0.5, 2, 1.5])  # an int among floats is widened
    back = decode(encode(mixed))
    assert back.ints == (1, 2, 3) and back.floats == [0.5, 2.0, 1.5]
    assert all(type(v) is float for v in back.floats)
    with pytest.raises(CodecError, match=r"field 'ids\[4000\]': expected int, got bool"):
        decode(orjson.dumps({"type": "Ids", "body": {"ids": [*range(4000), True], "scale": 1.0}}))
    with pytest.raises(CodecError, match=r"field 'ints\[2\]': expected int, got float"):
        decode(b'{"type":"Scalars","body":{"ints":[1,2,3.5],"floats":[]}}')


def test_fixed_tuple_length_is_checked():
    doc = orjson.loads(encode(_output()))
    doc["body"]["top_k"] = [1, 0.5, 2]
    with pytest.raises(CodecError, match=r"field 'top_k': expected 2 items"):
        decode(orjson.dumps(doc))


def test_bad_enum_value_lists_the_allowed_ones():
    doc = orjson.loads(encode(_output()))
    doc["body"]["finish"] = "exploded"
    with pytest.raises(CodecError, match=r"'exploded' is not a Finish \(one of 'stop', 'length'\)"):
        decode(orjson.dumps(doc))


def test_constructor_validation_failure_becomes_codec_error():
    with pytest.raises(
        CodecError, match=r"message Positive: Positive rejected the values: n must be positive"
    ):
        decode(b'{"type":"Positive","body":{"n":0}}')


def test_encoding_an_unregistered_type_is_refused():
    @dataclass(frozen=True)
    class Loose:
        n: int

    with pytest.raises(CodecError, match=r"Loose is not a registered message type"):
        encode(Loose(1))


def test_only_frozen_dataclasses_register():
    with pytest.raises(TypeError, match=r"must be a frozen dataclass"):

        @message
        @dataclass
        class Mutable:
            n: int


def test_ndarray_annotation_is_refused_on_first_use():
    @message("ndarray.holder")
    @dataclass(frozen=True)
    class Holder:
        x: np.ndarray

    with pytest.raises(TypeError, match=r"unsupported annotation.*shared memory"):
        decode(b'{"type":"ndarray.holder","body":{"x":[1]}}')


# --- one bad item never takes the others down -------------------------------------------------------


def test_a_list_whose_items_fail_alone_keeps_its_good_items_and_names_the_bad_ones():
    from core.scheduling.request import TokenDelta
    from ipc.messages import TokenDeltas

    body = {"outputs": [{"request_id": "a", "new_token_ids": [1]},
                        {"request_id": "b", "new_token_ids": [2], "num_cached_tokens": None},
                        {"new_token_ids": "x"},
                        {"request_id": "d", "new_token_ids": [4]}]}
    msg = decode(orjson.dumps({"type": "TokenDeltas", "body": body}))
    assert msg.outputs == [TokenDelta("a", [1]), TokenDelta("d", [4])]
    assert [(bad.index, bad.key) for bad in msg.invalid_outputs] == [(1, "b"), (2, None)]
    assert "outputs[1].num_cached_tokens': expected int, got null" in msg.invalid_outputs[0].error
    assert decode(encode(TokenDeltas(msg.outputs))).invalid_outputs == []


def test_a_codec_error_names_the_request_or_step_its_body_was_about():
    bad = {"type": "TokenizedRequest", "body": {"request_id": "r7", "prompt_token_ids": ["a"]}}
    with pytest.raises(CodecError) as caught:
        decode(orjson.dumps(bad))
    assert caught.value.type_name == "TokenizedRequest" and caught.value.names == {"request_id": "r7"}
    bad = {"type": "StepDone", "body": {"replica": 1, "rank": 0, "step_id": 12, "timings_ms": 3}}
    with pytest.raises(CodecError) as caught:
        decode(orjson.dumps(bad))
    assert caught.value.names == {"replica": 1, "rank": 0, "step_id": 12}
