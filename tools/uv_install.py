"""Install requirements into this interpreter's environment with uv, from the package sources pip is configured with.

`make test` (and every maintainer target) sets up .venv with `python tools/uv_install.py -r requirements.txt`: uv
installs the same exact pins as pip, but faster: a set already in its cache went into a fresh .venv in 34 s, bytecode
of every module compiled as pip does, where pip took 108 s on the same loaded machine (85-93 s when idle).

uv reads no pip configuration (pip.conf, PIP_* variables): given nothing, it would install from PyPI alone where pip
takes, say, torch's CPU build from PyTorch's index or a local folder. So pip's index, extra indexes, find-links,
constraints and no-index (from `pip config list`: the environment over the [install] section over [global]) are handed
to uv as options, with pip's rule for choosing among them (the best version from any source: uv's
`--index-strategy unsafe-best-match`). Exits with uv's status; the Makefile falls back to pip when it is not 0.
"""

import ast
import shlex
import subprocess
import sys

# pip's option -> uv's option; the options that pip reads as a whitespace-separated list.
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint", "no-index": "--no-index"}
LISTS = {"extra-index-url", "find-links", "constraint"}
RANK = {"global": 0, "install": 1, ":env:": 2}  # pip: PIP_* variables over [install] over [global]
TRUE = {"1", "true", "yes", "on"}


def pip_config(listing):
    """{option: value} of the options in OPTIONS from `pip config list`'s lines (`section.option='value'`); within
    one rank a later line (a later configuration file) wins, as in pip."""
    chosen = {}
    for line in listing.splitlines():
        name, equals, value = line.partition("=")
        section, _, option = name.rpartition(".")
        if equals and section in RANK and option in OPTIONS and RANK[section] >= chosen.get(option, (-1, ""))[0]:
            chosen[option] = (RANK[section], ast.literal_eval(value))
    return {option: value for option, (_, value) in chosen.items()}


def uv_options(config):
    """uv's options for pip's configuration `config` ({option: value}, as from pip_config)."""
    args = ["--index-strategy", "unsafe-best-match"]
    for option, flag in OPTIONS.items():
        value = config.get(option)
        if value is None:
            continue
        if option == "no-index":
            args += [flag] if value.strip().lower() in TRUE else []
        else:
            args += [item for each in (value.split() if option in LISTS else [value]) for item in (flag, each)]
    return args


def main(requirements):
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             check=True).stdout
    command = [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", sys.executable,
               "--compile-bytecode", *uv_options(pip_config(listing)), *requirements]
    print(shlex.join(command), flush=True)
    return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
