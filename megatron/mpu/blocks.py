"""The size of the blocks the vocab-parallel cross entropy (cross_entropy.py) reads logits in,
without torch: the memory estimate deepy.py makes before any worker starts counts them."""

BLOCK_ELEMENTS = 1 << 24  # logits values per block: 64 MiB of fp32 at a time
