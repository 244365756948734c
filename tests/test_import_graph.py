"""The package has no import cycles: not between modules, and not between its subpackages
(e.g. checkpointing and text_generation). Imports inside functions count too: deferring an
import hides a cycle from Python, not from the design."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "megatron"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _resolve(target: str, known) -> str | None:
    """The longest known module prefix of `target` (a name imported from a module is not one)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def import_graph() -> dict[str, set[str]]:
    """module -> the megatron modules it imports (anywhere in its body)."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                found = _resolve(target, known)
                if found and found != name:
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    top = lambda name: ".".join(name.split(".")[:2])  # noqa: E731
    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        out.setdefault(top(name), set()).update(top(t) for t in targets if top(t) != top(name))
    return out


def test_the_walker_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
    graph = import_graph()
    assert "megatron.checkpointing.reader" in graph["megatron.text_generation.runtime"]
    assert cycles(graph) == []


def test_no_import_cycle_between_subpackages():
    graph = subpackage_graph(import_graph())
    assert "megatron.text_generation" not in graph["megatron.checkpointing"]
    assert cycles(graph) == []


def test_one_module_touches_deepspeed_optimizer_internals():
    """DeepSpeed's private optimizer attributes and optimizer-file keys appear in
    checkpointing/optimizer_layouts.py (what the optimizer files hold) and
    training/optimizer_loops.py (the bf16 and ZeRO 1/2 optimizers' steps) only."""
    internals = ("_hp_mapping", "bf16_groups", "bit16_groups", "fp32_partitioned_groups_flat",
                 "single_partition_of_fp32_groups", "fp32_flat_groups", "base_optimizer_state",
                 "_get_ckpt_name", "_get_zero_ckpt_name", "ds_tensor", "ds_shape",
                 "grad_position", "fp16_groups", "refresh_fp32_params", "dp_process_group",
                 "ds_process_group", "save_zero_checkpoint", "BF16_Optimizer")
    owners = (PACKAGE / "checkpointing" / "optimizer_layouts.py",
              PACKAGE / "training" / "optimizer_loops.py")
    users = {}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        used = [name for name in internals if name in text]
        if used and path not in owners:
            users[str(path.relative_to(ROOT))] = used
    assert users == {}
