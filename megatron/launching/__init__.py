"""How deepy.py starts and watches workers: this machine's own (local.py), through DeepSpeed's
multi-node runner (runner.py); signals and leftovers (stopping.py); secrets (secrets.py)."""
