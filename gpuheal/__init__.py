"""gpuheal — notice, fix, prove and escalate faults on a small llama.cpp GPU fleet."""

__version__ = "0.1.0"
