"""Run configuration: GPT-NeoX-compatible YAML keys in typed sections, validated and derived.

    from megatron.neox_arguments import NeoXArgs, ConfigError, deepspeed_config
    args = NeoXArgs.from_ymls(["configs/tiny.yml"], ["train_iters=10"])

Importing this package does not import torch.
"""

from .deepspeed_config import deepspeed_config
from .derived import padded_vocab_size
from .errors import ConfigError
from .neox_args import NeoXArgs

__all__ = ["NeoXArgs", "ConfigError", "padded_vocab_size", "deepspeed_config"]
