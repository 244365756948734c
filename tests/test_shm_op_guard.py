"""Nothing in this repository lets DeepSpeed build its CPU shared-memory all-reduce op.

`deepspeed.init_distributed` JIT-compiles that op under a file lock in the torch extensions
cache unless `disable_deepspeed_shm_allreduce()` ran first. A build killed half-way (a timed-out
test, an interrupted run) leaves the lock behind, and every later process that reaches the
build waits on it forever. Each function that calls `deepspeed.init_distributed` must disable
the op before that call."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("megatron", "tests", "bench", "tools")


def _calls(node: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every call inside `node`."""
    out = []
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                out.append((call.lineno, f"{func.value.id}.{func.attr}"))
            elif isinstance(func, ast.Name):
                out.append((call.lineno, func.id))
    return out


def unguarded_calls() -> list[str]:
    found = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                calls = _calls(fn)
                disabled = [line for line, name in calls
                            if name.endswith("disable_deepspeed_shm_allreduce")]
                for line, name in calls:
                    if name == "deepspeed.init_distributed" and not any(d < line
                                                                        for d in disabled):
                        found.append(f"{path.relative_to(ROOT)}:{line} in {fn.name}")
    return found


def test_every_deepspeed_init_distributed_disables_the_shm_op_first():
    assert unguarded_calls() == []


def test_the_check_finds_an_unguarded_call(tmp_path):
    """The check itself sees a call without the guard (so the test above can fail)."""
    tree = ast.parse("def f():\n    deepspeed.init_distributed(dist_backend='gloo')\n")
    [fn] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert _calls(fn) == [(2, "deepspeed.init_distributed")]
