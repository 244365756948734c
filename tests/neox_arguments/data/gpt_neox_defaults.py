"""Writes gpt-neox-defaults.json: every config key GPT-NeoX declares, with its default, read
from a GPT-NeoX checkout's megatron/neox_arguments/neox_args.py and deepspeed_args.py (the
dataclass fields; a required key is recorded as "<required>", a default computed at run time
is left out). The file in this folder was written from commit ea7aefd8 (Apache License 2.0):

    python tests/neox_arguments/data/gpt_neox_defaults.py ../gpt-neox \
        > tests/neox_arguments/data/gpt-neox-defaults.json
"""

import ast
import json
import sys
from pathlib import Path


def declared_defaults(source: str) -> dict:
    defaults = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for field in node.body:
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
                if field.value is None:
                    defaults[field.target.id] = "<required>"
                    continue
                try:
                    defaults[field.target.id] = ast.literal_eval(field.value)
                except ValueError:  # computed when GPT-NeoX starts (git_hash)
                    pass
    return defaults


if __name__ == "__main__":
    package = Path(sys.argv[1]) / "megatron/neox_arguments"
    found = {}
    for name in ("neox_args.py", "deepspeed_args.py"):
        found.update(declared_defaults((package / name).read_text(encoding="utf-8")))
    json.dump(dict(sorted(found.items())), sys.stdout, indent=1)
    print()
