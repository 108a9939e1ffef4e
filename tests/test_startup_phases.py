"""Start-up tells what it is doing: rank 0 of each replica logs every phase of its start ("loading
weights ...", then "loading weights: done in 0.4 s"); other ranks and runners built without progress
log none. On a CPU the phases are loading weights and, for a TP replica, joining the group;
tests/gpu/test_gpu_runner.py checks profiling, compiling and graph capture on a GPU."""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys

from system_client import tiny_config

from core.execution.runner import ModelRunner

DONE = re.compile(r"loading weights: done in \d+\.\d s")


def test_a_runner_that_shows_progress_logs_each_phase_with_its_time(caplog):
    with caplog.at_level(logging.INFO, logger="cadence.startup"):
        ModelRunner(tiny_config(), show_progress=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "cadence.startup"]
    assert lines[0] == "loading weights ..." and DONE.fullmatch(lines[1]), lines
    assert len(lines) == 2  # on a CPU: no memory to profile, no kernels to compile, no graphs


def test_a_runner_without_progress_logs_no_phase(caplog):
    with caplog.at_level(logging.INFO, logger="cadence.startup"):
        ModelRunner(tiny_config(), show_progress=False)
    assert [r for r in caplog.records if r.name == "cadence.startup"] == []


def test_rank_0_of_each_replica_logs_its_phases_before_the_server_is_ready(tmp_path):
    command = [sys.executable, "-m", "procs.launcher", "--device", "cpu", "--dp", "2", "--tp", "2",
               "--max-model-len", "256", "--num-gpu-blocks-override", "64"]
    with open(tmp_path / "log", "w+") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            assert proc.stdout.readline().startswith("native clients connect to ipc://")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.seek(0)
        output = log.read()
    assert "starting qwen3-tiny: dp=2 tp=2 on cpu; rank 0 of each replica logs its start-up phases" in output
    for replica in (0, 1):
        rank0 = f"[cadence:executor dp={replica} tp=0] "
        phases = [line.split(rank0, 1)[1] for line in output.splitlines() if rank0 in line]
        assert phases[0] == "joining the TP group of 2 ranks ...", output
        assert phases[2] == "loading weights ...", output
        assert re.fullmatch(r"joining the TP group of 2 ranks: done in \d+\.\d s", phases[1])
        assert DONE.fullmatch(phases[3]) and phases[4].startswith("ready: "), output
        assert f"[cadence:executor dp={replica} tp=1] loading weights" not in output
