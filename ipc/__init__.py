"""The wire: every byte that crosses a process boundary, and how it travels.

What the processes say to each other, in one place:

    messages.py     every envelope the running processes exchange (requests, outputs, control,
                    step announcements) as frozen dataclasses; nothing is pickled
    process_specs.py  what a child process is started with, and the Ready it answers
    codec.py        how an envelope becomes msgpack-like bytes and back (with its arrays as frames)
    plan_layout.py  a StepPlan's bytes inside a ring slot (core/plan.py declares its arrays)
    step_frames.py  a StepResult's bytes: a StepDone envelope plus its arrays as raw frames
    shm_ring.py     the shared-memory ring of plan slots, its header words and doorbell protocol
    channels.py     ZeroMQ sockets that carry envelopes and frames
    endpoints.py    the addresses those sockets bind and connect to
    native_auth.py  the API key that native clients over tcp present to the tokenizer's front end
"""
