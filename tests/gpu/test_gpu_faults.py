"""The fault-injection matrix of tests/test_faults.py on the GPU: the same kills under the same
32-stream load, with the executors on CUDA (qwen3-tiny in float32, Triton attention, decode CUDA
graphs; the DP=2 replicas and the TP=2 ranks share the one card, TP over gloo)."""

import pytest
from test_faults import (  # noqa: F401 - the tests and fixtures run here again
    expected_tokens,
    test_a_dead_tp_rank_turns_the_server_unavailable_before_its_request_fails_and_its_wedged_peer_is_ended,
    test_a_killed_executor_of_a_dp1_server_ends_every_stream_with_an_error_within_20_s,
    test_a_killed_executor_of_a_dp2_server_costs_no_stream_a_token,
)


@pytest.fixture(scope="module")
def device() -> str:
    return "cuda:0"  # every executor on the first card, however many the machine has
