"""cProfile of the eager forward (decode batch 1 and a 16-token prefill) of the 14B shape in FP8 and bf16."""
import cProfile, io, pstats, sys, time
import numpy as np, torch
from benchmarks.step_profile import decode_plan, prefill_plan
from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.execution.runner import ModelRunner

quant = sys.argv[1] if len(sys.argv) > 1 else "fp8"
with torch.inference_mode():
    model = ModelConfig.from_name("qwen3-14b")
    if quant == "fp8":
        model = model.quantized_at_load("fp8")
    config = EngineConfig(model=model, cache=CacheConfig(block_size=16),
                          scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=8192, max_model_len=4096),
                          device="cuda", enforce_eager=True)
    runner = ModelRunner(config, num_pages=1024)
    rng = np.random.default_rng(0)
    for name, plan in (("decode1", decode_plan(1, 2048, 16, 129, rng)), ("prefill16", prefill_plan(16, 16, rng))):
        for _ in range(3):
            runner.forward_logits(plan)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(5):
            runner.forward_logits(plan)
        launch = (time.perf_counter() - t) / 5 * 1e3
        torch.cuda.synchronize()
        total = (time.perf_counter() - t) / 5 * 1e3
        print(f"{quant} {name}: host {launch:.1f} ms a step (with sync {total:.1f})")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            runner.forward_logits(plan)
        torch.cuda.synchronize()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
        print("\n".join(l[:160] for l in s.getvalue().splitlines()[6:34]))
