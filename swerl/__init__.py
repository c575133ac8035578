"""swerl: reinforcement learning for LLM software-engineering agents."""

__version__ = "0.1.0"
