"""Offline batch generation: the engine started for one program, no server to run first.

    from api.offline import LLM
    from core.sampling_params import SamplingParams

    with LLM("qwen3-tiny", "--dp", "2") as llm:
        for result in llm.generate(["Once upon a time", [9707, 11, 1879]], SamplingParams(max_tokens=32)):
            print(result.text)

`LLM(model, *flags)` takes `cadence serve`'s engine flags (procs/args.py) and starts the same
processes it does (tokenizer, scheduler, executors); `generate` goes through the native client, so
an offline run batches, caches prefixes and fails exactly as a server would. The other batch path
is `api.client.Client` connected to a running server, for jobs that share one.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from api.client import Client
from api.generation import Generation, Prompt
from core.config import EngineConfig
from core.sampling_params import SamplingParams
from ipc.messages import GenerateRequest
from procs.args import add_engine_args, config_from_args, launch_options_from_args
from procs.launcher import Launcher


class _FlagParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # a library raises; it does not exit the program
        raise ValueError(f"LLM flags: {message}")


class LLM:
    """The engine's processes for the lifetime of this object; `close` (or `with`) stops them."""

    def __init__(self, model: str = "qwen3-tiny", *engine_flags: str, timeout_s: float = 600.0) -> None:
        parser = add_engine_args(_FlagParser(prog="LLM"))
        args = parser.parse_args(["--model", model, *engine_flags])
        self.config: EngineConfig = config_from_args(args)
        self.timeout_s = timeout_s
        self._launcher = Launcher(self.config, launch_options_from_args(args))
        self._launcher.start()
        try:
            self.client = Client(self._launcher.endpoints.tokenizer_frontend, timeout_s=timeout_s,
                                 name="offline")
        except BaseException:
            self._launcher.shutdown()
            raise

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(self, prompts: Iterable[Prompt | GenerateRequest], params: SamplingParams | None = None,
                 **options: bool) -> list[Generation]:
        """Every prompt (text, token ids, or chat turns) run to its end; results in the prompts'
        order. A refused prompt comes back with `refused` set; the others still run."""
        return self.client.generate(prompts, params, timeout_s=self.timeout_s, **options)

    def close(self) -> None:
        self.client.close()
        self._launcher.shutdown()
