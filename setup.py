"""Install the `megatron` package: `pip install -e .` (torch 2.13.0 first; see the Makefile)."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
REQ = HERE / "requirements"


def requirements(name: str) -> list[str]:
    lines = (REQ / name).read_text().splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


EXTRAS = ("dev", "wandb", "comet", "tensorboard", "eval", "hf", "flashattention", "mpi",
          "plot", "data")

setup(
    name="neox-megatron",
    version="0.1.0",
    description="Config-driven GPT training with DeepSpeed 3D parallelism, CPU-first and tested",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["megatron", "megatron.*"]),
    install_requires=requirements("requirements.txt"),
    extras_require={name: requirements(f"requirements-{name}.txt") for name in EXTRAS},
)
