"""A config-driven framework for training GPT-style language models with DeepSpeed.

Importing this package has no side effects: no distributed init, no device calls, no logging setup.
"""

__version__ = "0.1.0"
