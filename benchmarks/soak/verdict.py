"""How a soak call's checks end in a failure (benchmarks/soak/calls.py, agent_replies.py)."""


class Verdict(Exception):
    """Ends one call's checks with a failure; its message says what was wrong."""
