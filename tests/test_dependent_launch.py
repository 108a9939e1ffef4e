"""Where programmatic dependent launch is off: the CPU, the Triton interpreter, CADENCE_PDL=0."""

from __future__ import annotations

import torch

from core.execution import dependent_launch


def test_off_on_the_cpu():
    assert dependent_launch.dependent_launch(torch.device("cpu")) is False


def test_off_in_the_interpreter_and_when_turned_off(monkeypatch):
    for name, value in (("TRITON_INTERPRET", "1"), ("CADENCE_PDL", "0")):
        with monkeypatch.context() as patch:
            patch.setenv(name, value)
            dependent_launch.reread_environment()
            patch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
            assert dependent_launch._enabled_on(0) is False
    dependent_launch.reread_environment()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("CADENCE_PDL", raising=False)
    assert dependent_launch._enabled_on(0) is True, "on by default from sm_90"
    dependent_launch.reread_environment()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    assert dependent_launch._enabled_on(0) is False, "off before sm_90"
    dependent_launch.reread_environment()


def test_off_with_a_triton_that_has_no_grid_dependency_control(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("CADENCE_PDL", raising=False)
    monkeypatch.setattr(dependent_launch, "gdc_wait", None)  # what the import leaves on triton < 3.3
    dependent_launch.reread_environment()
    assert dependent_launch._enabled_on(0) is False
    dependent_launch.reread_environment()


def test_launches_name_the_pdl_option_only_when_on():
    assert dependent_launch.launch_options(True) == {"launch_pdl": True}
    assert dependent_launch.launch_options(False) == {}, "an older triton refuses a launch_pdl keyword"
