"""Which FP8 GEMM a layer gets (core/execution/model/fp8_gemm.choose_gemm): auto takes cuBLAS's
block-scaled scaled_mm where it runs, with the row GEMV for steps of one row (`row_gemv`; cuBLAS at
every row count only when `scaled_mm` is named), and says so when it falls back to the Triton
kernels; a name that cannot run here is refused with the reason."""

from __future__ import annotations

import logging

import pytest
import torch

from core.execution.model import fp8_gemm

CUDA = torch.device("cuda", 0)


@pytest.fixture
def scaled_mm(monkeypatch):
    """Set what the (mocked) availability probe answers: None (runs) or a reason."""
    answer = {"reason": None}
    monkeypatch.setattr(fp8_gemm, "scaled_mm_unavailable", lambda device: answer["reason"])
    fp8_gemm._log_auto_choice.cache_clear()
    monkeypatch.delenv(fp8_gemm.ENV, raising=False)
    yield answer
    fp8_gemm._log_auto_choice.cache_clear()


def test_auto_is_dequant_on_the_cpu(scaled_mm):
    assert fp8_gemm.choose_gemm(torch.device("cpu")) is fp8_gemm.dequant_gemm


def test_auto_is_scaled_mm_with_the_row_gemv_at_one_row_where_it_runs(scaled_mm):
    assert fp8_gemm.choose_gemm(CUDA) is fp8_gemm.row_gemv_gemm


def test_auto_falls_back_to_triton_and_says_why(scaled_mm, caplog):
    scaled_mm["reason"] = "RuntimeError: Invalid scaling configuration"
    with caplog.at_level(logging.INFO, logger=fp8_gemm.__name__):
        assert fp8_gemm.choose_gemm(CUDA) is fp8_gemm.triton_gemm
        fp8_gemm.choose_gemm(CUDA)  # every layer asks; the reason is logged once
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "triton" in lines[0] and "Invalid scaling configuration" in lines[0]


def test_the_environment_names_the_gemm(scaled_mm, monkeypatch):
    monkeypatch.setenv(fp8_gemm.ENV, "triton")
    assert fp8_gemm.choose_gemm(CUDA) is fp8_gemm.triton_gemm
    monkeypatch.setenv(fp8_gemm.ENV, "dequant")
    assert fp8_gemm.choose_gemm(CUDA) is fp8_gemm.dequant_gemm
    monkeypatch.setenv(fp8_gemm.ENV, "scaled_mm")  # cuBLAS at every row count
    assert fp8_gemm.choose_gemm(CUDA) is fp8_gemm.scaled_mm_gemm


@pytest.mark.parametrize("name,device,message", [
    ("cutlass", CUDA, "'cutlass' is not an FP8 GEMM"),
    ("triton", torch.device("cpu"), "needs a CUDA device"),
    ("scaled_mm", CUDA, "cannot run the block-scaled scaled_mm here (no block scales)"),
    ("row_gemv", CUDA, "CADENCE_FP8_GEMM=row_gemv: torch"),
])
def test_a_gemm_that_cannot_run_here_is_refused_with_the_reason(scaled_mm, name, device, message):
    scaled_mm["reason"] = "no block scales"
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fp8_gemm.choose_gemm(device, name)
