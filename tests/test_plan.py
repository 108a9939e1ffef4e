"""pack_plan / unpack_plan: a StepPlan survives a shared-memory slot bit for bit, as zero-copy views."""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
from plans import Chunk, make_plan

from core.plan import StepPlan
from core.sampling_params import SAMPLING_COLUMNS, SAMPLING_DTYPE, SamplingParams, sampling_row, sampling_rows
from ipc.plan_layout import pack_plan, packed_plan_header, packed_plan_nbytes, unpack_plan

BLOCK_SIZE = 16
ARRAY_FIELDS = [f.name for f in fields(StepPlan) if f.name not in ("step_id", "replica")]


def with_history(plan: StepPlan, histories: list[tuple[list[int], int]]) -> StepPlan:
    """Give request i the token history histories[i] = (ids, prompt_len)."""
    lens = [len(ids) for ids, _ in histories]
    return replace(
        plan,
        history_start=np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
        history_prompt_len=np.asarray([p for _, p in histories], np.int32),
        history_ids=np.asarray([i for ids, _ in histories for i in ids], np.int32),
    )


def single_prefill() -> StepPlan:
    return make_plan([Chunk(list(range(100, 137)), 0, [7, 2, 5])], BLOCK_SIZE, step_id=1)


def mixed_step() -> StepPlan:
    """A second prefill chunk that starts mid-page, a decode, and a mid-prefill chunk that samples nothing."""
    plan = make_plan(
        [Chunk(list(range(13, 29)), 13, [5, 9], temperature=0.7, seed=11, num_logprobs=3),
         Chunk([42], 40, [1, 3, 8], output_pos=9, seed=2**40 + 3, num_logprobs=0),
         Chunk(list(range(5)), 0, [4], sample=False)],
        BLOCK_SIZE, step_id=812,
    )
    plan = with_history(plan, [(list(range(13)), 13), ([9, 8, 7, 42], 2), ([], 0)])
    sampling = plan.sampling.copy()
    for name, values in dict(top_p=[0.9, 1.0, 0.5], top_k=[20, 0, 5], min_p=[0.05, 0.0, 0.0],
                             repetition_penalty=[1.1, 1.0, 1.3], presence_penalty=[0.5, -0.25, 0.0],
                             frequency_penalty=[0.0, 0.125, -2.0]).items():
        sampling[name] = values
    bias = dict(bias_start=np.array([0, 2, 3, 3], np.int32), bias_ids=np.array([7, 151000, 42], np.int32),
                bias_values=np.array([5.0, -100.0, 0.5], np.float32))
    return replace(plan, replica=3, sampling=sampling, **bias)


def decode_batch() -> StepPlan:
    # Ragged block tables: request i needs 1 + (i + 3) // 4 pages of 4 slots.
    chunks = [Chunk([1000 + i], i + 3, [i, 20 + i, 30 + i][: 1 + (i + 3) // 4], output_pos=i)
              for i in range(8)]
    plan = make_plan(chunks, 4, step_id=2**40 + 7)
    return with_history(replace(plan, replica=1), [([i] * (i + 1), i // 2) for i in range(8)])


PLANS = {"single_prefill": single_prefill, "mixed_step": mixed_step, "decode_batch": decode_batch}


def plan_nbytes(plan: StepPlan) -> int:
    width, num_history = plan.block_table.shape[1], len(plan.history_ids)
    return packed_plan_nbytes(plan.num_reqs, plan.num_tokens, width, num_history, len(plan.bias_ids))


def assert_plans_equal(ours: StepPlan, expected: StepPlan) -> None:
    assert (ours.step_id, ours.replica) == (expected.step_id, expected.replica)
    for name in ARRAY_FIELDS:
        got, want = getattr(ours, name), getattr(expected, name)
        assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
        assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
        # Bitwise, so float fields must survive exactly (no casts through another dtype).
        assert got.tobytes() == want.tobytes(), f"{name}: {got} != {want}"


@pytest.mark.parametrize("make", PLANS.values(), ids=PLANS.keys())
def test_unpack_returns_every_field_of_the_packed_plan_exactly(make):
    plan = make()
    buffer = bytearray(plan_nbytes(plan))
    assert pack_plan(plan, buffer) == len(buffer)
    assert_plans_equal(unpack_plan(buffer), plan)


def test_plan_without_history_round_trips_with_empty_history_ids():
    plan = single_prefill()
    assert len(plan.history_ids) == 0
    buffer = bytearray(plan_nbytes(plan))
    pack_plan(plan, buffer)
    unpacked = unpack_plan(buffer)
    assert unpacked.history_ids.shape == (0,)
    assert unpacked.history_start.tolist() == [0, 0]


@pytest.mark.parametrize("make", PLANS.values(), ids=PLANS.keys())
def test_unpacked_arrays_are_aligned_views_into_the_buffer_not_copies(make):
    plan = make()
    slot = np.zeros(plan_nbytes(plan), np.uint8)
    pack_plan(plan, slot)
    unpacked = unpack_plan(slot)
    for name in ARRAY_FIELDS:
        array = getattr(unpacked, name)
        if array.size == 0:
            continue  # an empty array owns no bytes to share
        assert np.shares_memory(array, slot), f"{name} is a copy, not a view into the slot"
        assert (array.ctypes.data - slot.ctypes.data) % 64 == 0, f"{name} is not 64-byte aligned"
    # A write through the buffer is visible through the view.
    offset = unpacked.input_ids.ctypes.data - slot.ctypes.data
    slot[offset : offset + 4].view(np.int32)[0] = -12345
    assert unpacked.input_ids[0] == -12345


def test_arrays_of_one_plan_do_not_overlap():
    plan = mixed_step()
    slot = np.zeros(plan_nbytes(plan), np.uint8)
    pack_plan(plan, slot)
    unpacked = unpack_plan(slot)
    arrays = [(name, getattr(unpacked, name)) for name in ARRAY_FIELDS if getattr(unpacked, name).size]
    for i, (name_a, a) in enumerate(arrays):
        for name_b, b in arrays[i + 1 :]:
            assert not np.shares_memory(a, b), f"{name_a} and {name_b} overlap in the slot"


@pytest.mark.parametrize("make", PLANS.values(), ids=PLANS.keys())
def test_buffer_one_byte_too_small_raises_naming_the_step(make):
    plan = make()
    nbytes = plan_nbytes(plan)
    buffer = bytearray(nbytes - 1)
    message = f"step {plan.step_id} needs {nbytes} bytes, the slot holds {nbytes - 1}"
    with pytest.raises(ValueError, match=message):
        pack_plan(plan, buffer)
    assert buffer == bytearray(nbytes - 1), "a refused pack must not write into the slot"


def test_packed_plan_nbytes_is_what_pack_plan_uses():
    for make in PLANS.values():
        plan = make()
        slot = bytearray(1 << 16)
        assert pack_plan(plan, slot) == plan_nbytes(plan)


def test_packed_plan_nbytes_grows_with_every_dimension():
    base = packed_plan_nbytes(4, 64, 8, 16)
    assert packed_plan_nbytes(5, 64, 8, 16) > base
    assert packed_plan_nbytes(4, 65 + 16, 8, 16) > base
    assert packed_plan_nbytes(4, 64, 8 + 16, 16) > base
    assert packed_plan_nbytes(4, 64, 8, 16 + 16) > base
    assert packed_plan_nbytes(4, 64, 8, 16, 16) > base


@pytest.mark.parametrize("make", PLANS.values(), ids=PLANS.keys())
def test_header_reads_step_id_and_replica_without_unpacking(make):
    plan = make()
    slot = memoryview(bytearray(plan_nbytes(plan)))
    pack_plan(plan, slot)
    assert packed_plan_header(slot) == (plan.step_id, plan.replica)


def test_smaller_plan_packed_into_a_used_slot_unpacks_without_stale_data():
    slot = bytearray(1 << 16)
    pack_plan(decode_batch(), slot)
    small = replace(single_prefill(), step_id=813, replica=2)
    pack_plan(small, slot)
    assert packed_plan_header(slot) == (813, 2)
    assert_plans_equal(unpack_plan(slot), small)


def test_sampling_row_holds_what_the_sampler_needs_of_the_params():
    params = SamplingParams(temperature=0.5, top_p=0.9, top_k=-1, min_p=0.1, seed=None,
                            repetition_penalty=1.2, presence_penalty=-0.5, frequency_penalty=0.25, logprobs=3)
    row = sampling_row(params, seed=-(2**62))
    assert SAMPLING_DTYPE.names == tuple(c.name for c in SAMPLING_COLUMNS)
    assert row["top_k"] == 0, "top_k -1 (no limit) travels as 0"
    assert row["seed"] == -(2**62), "the seed is the request's (drawn when the params have none)"
    assert row["num_logprobs"] == 3 and sampling_row(SamplingParams(), 0)["num_logprobs"] == -1
    floats = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
    for name in floats:
        assert row[name] == np.float32(getattr(params, name)), name


def test_plan_built_without_optional_fields_gets_their_neutral_values():
    full = single_prefill()
    plan = StepPlan(step_id=5, replica=0, query_start=full.query_start, seq_lens=full.seq_lens,
                    block_table=full.block_table, logits_index=full.logits_index, input_ids=full.input_ids,
                    positions=full.positions, kv_index=full.kv_index)
    assert plan.sampling.tobytes() == sampling_rows(1).tobytes()
    assert plan.sampling[0]["temperature"] == SamplingParams().temperature
    assert plan.output_pos.tolist() == [0] and plan.prev_row.tolist() == [-1]
    assert plan.history_start.tolist() == [0, 0] and plan.history_prompt_len.tolist() == [0]
    assert plan.history_ids.shape == (0,)
    buffer = bytearray(plan_nbytes(plan))
    pack_plan(plan, buffer)
    assert_plans_equal(unpack_plan(buffer), plan)


def test_sampling_rows_refuses_a_column_that_does_not_exist():
    with pytest.raises(KeyError, match="'top_a' is not a sampling column"):
        sampling_rows(2, top_a=0.5)
