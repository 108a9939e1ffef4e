"""Start-up on several cards (skipped with fewer than two visible): every rank on a card of its own,
the TP group joined over NCCL, and the failures a multi-card start-up can meet ending fast with
the rank and the card named: more ranks than cards, and a rank that never reaches its peers.

    python -m pytest tests/gpu/test_gpu_multi_card_startup.py
"""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
import torch
from system_client import GREEDY, SystemClient, tiny_config

from ipc.shm_ring import SHM_DIR, run_prefix
from procs.launcher import Launcher, LaunchError, LaunchOptions

NUM_CARDS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(NUM_CARDS < 2, reason="needs two visible GPUs")


def _config(dp: int = 1, tp: int = 1):
    return dataclasses.replace(tiny_config(dp=dp, tp=tp, num_pages=256), device="cuda")


def test_tp2_puts_each_rank_on_a_card_of_its_own_and_serves():
    with Launcher(_config(tp=2), LaunchOptions(startup_timeout_s=300)) as launcher, \
            SystemClient(launcher.endpoints.tokenizer_frontend) as client:
        assert [c.device for c in launcher.executors] == ["cuda:0", "cuda:1"]
        result = client.generate({"x": {"prompt": "hello"}}, GREEDY)["x"]
        assert result.error is None and len(result.token_ids) == GREEDY.max_tokens


def test_more_ranks_than_cards_are_refused_before_anything_starts():
    launcher = Launcher(_config(dp=NUM_CARDS + 1))
    started = time.monotonic()
    refusal = (f"needs {NUM_CARDS + 1} GPUs, one per rank, but {NUM_CARDS} are visible .*executor "
               f"dp={NUM_CARDS} tp=0 would need cuda:{NUM_CARDS}")
    with pytest.raises(LaunchError, match=refusal):
        launcher.start()
    assert time.monotonic() - started < 10 and launcher.children == []


def test_a_rank_that_never_joins_over_nccl_is_named_with_its_card_after_the_dist_timeout(monkeypatch):
    monkeypatch.setenv("CADENCE_INJECT_FAULT", "dp=0 tp=1 at=join do=hang")
    launcher = Launcher(_config(tp=2), LaunchOptions(startup_timeout_s=300, dist_timeout_s=10))
    started = time.monotonic()
    failure = (r"executor dp=0 tp=0 on cuda:0 failed to start: .*tp=1 of 2 ranks did not join the TP group "
               r"within 10 s .*still starting: executor dp=0 tp=1 on cuda:1")
    with pytest.raises(LaunchError, match=failure):
        launcher.start()
    assert time.monotonic() - started < 60
    assert all(not c.process.is_alive() for c in launcher.children)
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(run_prefix(launcher.run_id))] == []
