"""The one-shot all-reduce kernel (core/execution/all_reduce_kernel.py) and its synchronization, on
the CPU: 2 and 4 processes, each running the kernel under the Triton interpreter over exchange
buffers in one shared-memory file that every process has mapped (the interpreter's atomics are real
atomics on that memory), as GPUs map each other's buffers. A rank that arrives late (it sleeps
before some calls) makes its peers wait on the flags; a rank that raced ahead into the next call
would show as a wrong sum. Calls alternate sizes and dtypes so that both data halves and every
program's epoch are exercised. tests/gpu/test_gpu_custom_all_reduce.py repeats this with CUDA IPC.

Run alone, this file sets TRITON_INTERPRET=1 itself; in a full run `test_kernels_in_a_fresh_interpreter`
runs it again in a child process (tests/triton_interpreter.py).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from triton_interpreter import is_interpreted, run_in_fresh_interpreter, skip_unless_interpreted  # noqa: E402

triton = pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]')")

from core.execution import all_reduce_kernel  # noqa: E402
from core.execution.custom_all_reduce import CustomAllReduce, connect, exchange_buffer_bytes  # noqa: E402
from core.execution.distributed import TPGroup  # noqa: E402

INTERPRETED = is_interpreted(triton.language.zeros, all_reduce_kernel._one_shot_all_reduce_kernel)
MAX_BYTES = 64 * 1024
# (elements, dtype) of the calls, in order; the largest fills the data half; several programs.
CALLS = [(1, torch.float32), (3000, torch.bfloat16), (MAX_BYTES // 4, torch.float32), (5, torch.float16),
         (2 * all_reduce_kernel.CHUNK + 7, torch.bfloat16), (1, torch.float32), (777, torch.float32),
         (MAX_BYTES // 2, torch.bfloat16), (64, torch.float16)]


@pytest.fixture(autouse=True)
def _kernels_run_here_or_in_the_child(request):
    skip_unless_interpreted(request, INTERPRETED)


def test_kernels_in_a_fresh_interpreter():
    run_in_fresh_interpreter(__file__, INTERPRETED)


def rank_input(call: int, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * call + rank)
    return (torch.randn(numel, generator=generator) * (rank + 1)).to(dtype)


def expected_sum(call: int, world: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The kernel's definition: the ranks' values summed in float32 in rank order, then rounded once."""
    total = torch.zeros(numel)
    for rank in range(world):
        total += rank_input(call, rank, numel, dtype).float()
    return total.to(dtype)


def matches(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Equal, up to the last bit of a 16-bit result: the interpreter converts float32 to bf16 / fp16
    by truncation where the GPU rounds to nearest. A sum with a peer's data of another call (a
    broken wait) is off by the data's whole size."""
    if expected.dtype == torch.float32:
        return torch.equal(got, expected)
    finfo = torch.finfo(expected.dtype)
    ulp = expected.float().abs() * finfo.eps + finfo.tiny
    return bool(((got.float() - expected.float()).abs() <= ulp).all())


def mapped_buffers(path: str, world: int) -> list[torch.Tensor]:
    """Every rank's exchange buffer, as this process maps the shared file."""
    per_rank = exchange_buffer_bytes(world, MAX_BYTES)
    whole = torch.from_file(path, shared=True, size=per_rank * world, dtype=torch.uint8)
    return [whole[r * per_rank:(r + 1) * per_rank] for r in range(world)]


def run_rank(rank: int, world: int, path: str, late_rank: int, failures) -> None:
    try:
        all_reduce = CustomAllReduce(rank, mapped_buffers(path, world), MAX_BYTES)
        for call, (numel, dtype) in enumerate(CALLS * 2):
            if rank == late_rank and call % 3 == 1:
                time.sleep(0.2)  # the peers reach the flags first and must wait
            x = rank_input(call, rank, numel, dtype)
            assert all_reduce(x) is x
            expected = expected_sum(call, world, numel, dtype)
            if not matches(x, expected):
                failures.put(f"tp={rank} call {call} ({numel} x {dtype}): max error "
                             f"{(x.float() - expected.float()).abs().max():.3g}")
                return
    except Exception as exc:  # noqa: BLE001 - reported to the test
        failures.put(f"tp={rank}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_gets_the_sum_of_every_call(world, tmp_path):
    path = str(tmp_path / "exchange")
    with open(path, "wb") as f:  # zeroed before any rank's first call
        f.truncate(exchange_buffer_bytes(world, MAX_BYTES) * world)
    context = multiprocessing.get_context("spawn")
    failures = context.Queue()
    ranks = [context.Process(target=run_rank, args=(r, world, path, world - 1, failures))
             for r in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=240)
    stuck = [r for r, p in enumerate(ranks) if p.is_alive()]
    for process in ranks:
        process.kill()
    assert not stuck, f"ranks {stuck} still waiting in the kernel"
    assert failures.empty(), failures.get()
    assert [p.exitcode for p in ranks] == [0] * world


def test_one_rank_is_the_identity():
    buffer = torch.zeros(exchange_buffer_bytes(1, MAX_BYTES), dtype=torch.uint8)
    all_reduce = CustomAllReduce(0, [buffer], MAX_BYTES)
    for call in range(3):  # the same half again after two calls
        x = rank_input(call, 0, 2500, torch.float32)
        assert torch.equal(all_reduce(x.clone()), x)


class _Fake:
    max_bytes = 1024
    device = torch.device("cpu")

    def __init__(self):
        self.calls = 0

    def fits(self, x):
        return x.numel() * x.element_size() <= self.max_bytes

    def __call__(self, x):
        self.calls += 1
        return x


def test_the_group_sends_small_messages_to_the_kernel_and_captures_only_what_it_can():
    custom = _Fake()
    group = TPGroup(rank=0, size=1, group=None, custom_all_reduce=custom)
    group.all_reduce(torch.zeros(256))  # 1 KB: the kernel
    group.all_reduce(torch.zeros(257))  # larger: the collective library (here none)
    assert custom.calls == 1
    assert TPGroup().captures_all_reduce(1 << 30)  # no collective at all
    assert group.captures_all_reduce(1024)


def test_a_rank_that_cannot_share_turns_the_kernel_off_on_every_rank(caplog):
    """On a machine without CUDA no rank can allocate its buffer: every rank gets None, at once, and
    rank 0 logs one line that says why."""
    if torch.cuda.is_available():
        pytest.skip("this machine can share CUDA buffers")
    store = torch.distributed.HashStore()
    store.set_timeout(__import__("datetime").timedelta(seconds=30))
    results = {}

    def rank(r):
        results[r] = connect(store, r, 2, torch.device("cuda", 0), MAX_BYTES)

    with caplog.at_level(logging.WARNING, logger="core.execution.custom_all_reduce"):
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert results == {0: None, 1: None}
    lines = [r.getMessage() for r in caplog.records if "custom all-reduce off" in r.getMessage()]
    assert len(lines) == 1 and "could not share its buffer" in lines[0], lines


def test_an_ipc_handle_travels_as_json_and_only_its_own_kinds_of_value_come_back():
    """What rebuild_cuda_tensor takes (plain values, bytes, a dtype, two classes) survives the JSON;
    anything else that might be read from the store is refused, never turned into an object."""
    from core.execution import ipc_handle

    args = (torch.Tensor, torch.Size([4096]), (1,), 0, torch.UntypedStorage, torch.uint8, 0,
            b"\x00\xffhandle", 4096, 0, False, b"/torch_123_ref", 7, b"\x01event", True)
    encoded = json.dumps([ipc_handle._encode(a) for a in args])
    decoded = tuple(ipc_handle._decode(a) for a in json.loads(encoded))
    assert decoded == tuple(tuple(a) if isinstance(a, torch.Size) else a for a in args)
    for hostile in ({"class": "os.system"}, {"dtype": "load"}, {"module": "builtins"}):
        with pytest.raises(ValueError):
            ipc_handle._decode(hostile)
    with pytest.raises(ValueError):
        ipc_handle._encode(torch.nn.Module)
