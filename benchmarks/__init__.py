"""Cadence's benchmarks and drills. Every module at this level and the packages generalization/ and
soak/ are commands; `python -m benchmarks.<name> --help` says how to run each:

Performance
    load            drive a running server; latency percentiles, throughput, prefix-cache hit rate
    suite           start `cadence serve` per setting and run `load` (and `peer_hf`) against each
    report          docs/reports/performance.md from the JSON of `suite` and the GPU benchmarks
    peer_hf         the same random workload through transformers' `generate_batch`
    system_batch    one batch through the multiprocess system, without HTTP
    kernels         achieved bandwidth of the Triton attention kernels (GPU)
    step_profile    where one step's milliseconds go, the ModelRunner alone (GPU)
    fp8_tiles       every FP8 GEMM path and tile per Qwen3-14B product and row count (GPU)
    fp8_activations SiLU * up and the FP8 activation quantization, apart and in one pass (GPU)
    broadcast       plan broadcast latency, scheduler to every TP reader
    arrivals        what one arriving request costs the host before it joins a step
    structured_masks what structured outputs' token masks cost the host per step

Correctness and reliability
    model_parity    Cadence's logits against transformers' with the same weights
    generalization  the functional generalization matrix (a package; tests/test_generalization.py
                    runs its CPU subset)
    soak            a long mixed load against a whole server; nothing may leak (a package)
    fault_drill     kill one of a server's processes under load and report what the clients saw

lib/ holds what several commands share and none runs: the load generator's datasets, backends,
run and summary (load, fault_drill, peer_hf, report) and a server's processes read from /proc
(fault_drill, soak). NOTES.md records each performance change's prediction and outcome.
"""
