"""The blocks the CPU attention kernel (cpu_attention.py) works in, without torch: the memory
estimate deepy.py makes before any worker starts counts the probabilities it keeps."""

BLOCK = 64  # queries per block: the fastest of 32-256 on a 2-core AVX-512 CPU
MAX_POSITIONS = 768  # longer sequences go through torch SDPA (memory: cpu_attention.py)


def kept_probabilities(s: int) -> int:
    """Probabilities the kernel keeps for its backward per sequence and head over s positions:
    each block of queries over the keys up to its last, about s(s + BLOCK)/2 of the s^2."""
    return sum((min(start + BLOCK, s) - start) * min(start + BLOCK, s)
               for start in range(0, s, BLOCK))
