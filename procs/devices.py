"""Which device each executor runs on, and the check that the cards asked for are there.

The launcher calls `assign_devices` before it starts any process, so a layout that needs more cards
than are visible is refused at once, naming the counts and the first rank left without a card,
instead of failing (or hanging in a rendezvous) minutes later inside an executor.
"""

from __future__ import annotations

import logging
import os

from core.config import EngineConfig

log = logging.getLogger("cadence.launcher")


class GPUCountError(RuntimeError):
    """The layout needs more GPUs than are visible; the message names the counts and a rank."""


def visible_gpu_count() -> int:
    """CUDA devices this process can see (CUDA_VISIBLE_DEVICES applies); 0 without CUDA."""
    import torch

    return torch.cuda.device_count()


def assign_devices(config: EngineConfig, num_visible: int | None = None) -> list[str]:
    """The device of every executor, replica-major (dp=0 tp=0, dp=0 tp=1, ..., dp=1 tp=0, ...).

    On the CPU every executor is "cpu". With --device cuda:N every executor shares card N. With
    --device cuda each executor gets a card of its own; on a machine with one visible card every
    executor shares it (the one-card development layout: DP replicas and TP ranks side by side, TP
    over gloo); with several visible cards but fewer than the executors, GPUCountError.
    `num_visible` defaults to visible_gpu_count()."""
    world = config.parallel.world_size
    if not config.device.startswith("cuda"):
        return ["cpu"] * world
    if ":" in config.device:
        return [config.device] * world
    num_visible = visible_gpu_count() if num_visible is None else num_visible
    if num_visible == 0:
        raise GPUCountError("--device cuda, but no CUDA device is visible")
    if num_visible == 1 and world > 1:
        log.warning("one GPU is visible: the %d executors (--dp %d --tp %d) share cuda:0", world,
                    config.parallel.dp_size, config.parallel.tp_size)
        return ["cuda:0"] * world
    if world > num_visible:
        tp = config.parallel.tp_size
        first_without = f"executor dp={num_visible // tp} tp={num_visible % tp}"
        visible_env = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        raise GPUCountError(
            f"--dp {config.parallel.dp_size} --tp {tp} needs {world} GPUs, one per rank, but "
            f"{num_visible} are visible (CUDA_VISIBLE_DEVICES={visible_env}): {first_without} would "
            f"need cuda:{num_visible}, which is not there. Make {world} GPUs "
            f"visible, lower --dp/--tp, or name one card (--device cuda:0) for every rank to share")
    return [f"cuda:{g}" for g in range(world)]
