"""``%kdist run [kdist options] script.py [script args]``: an existing script, on every rank.

Like IPython's ``%run``, but on the engines of an ``%%kdist`` run: the kernel reads the file,
checks its syntax once, and runs it through the same path as a cell (the same strategies,
dashboard, rank-0 output, ``--pull``, failure handling and Stop) as a one-line cell that calls
:func:`run_main` on every rank. There the script runs as ``__main__`` in the rank's namespace
(its ``if __name__ == "__main__":`` block runs, its globals can be ``--pull``-ed), with
``sys.argv`` = ``[path, *script args]``, ``__file__`` set and the script's folder first on
``sys.path``; the launcher variables of the run (``TF_CONFIG``, torchrun's, ...) are set as for
any cell. ``sys.exit(0)`` (or ``sys.exit()``) ends the script as success; another status fails
that rank. Keras' automatic names ("dense_1") start afresh for the script, as in the new process
a launcher would start (a warm engine has counted on over earlier cells), so that what is keyed
by them -- a Keras model's ``state_dict()`` on PyTorch, say -- is the same in every launch;
later cells go on counting after the script's names.
"""

from __future__ import annotations

import os
import re
import shlex

from IPython.core.error import UsageError

from ... import spec as specmod
from ...errors import ScriptExited

USAGE = """%kdist run [kdist options] script.py [script args]

Run an existing training script on every rank, as `python script.py [script args]` would run
under torchrun / a TF_CONFIG launch / horovodrun: as __main__ (its `if __name__ == "__main__":`
block runs), with sys.argv = [script.py, *script args], __file__ set, and the run's launcher
variables (TF_CONFIG; RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ... under torch). The script's
own set-up calls join the run: tf.distribute.MultiWorkerMirroredStrategy(),
torch.distributed.init_process_group(), torch.multiprocessing.start_processes() and spawn()
(each rank is one of the processes), jax.distributed.initialize(), hvd.init().

kdist's options come before the script's path, the script's own arguments after it:

    %kdist run --strategy multiworker --np 2 --pull model train.py --epochs 3

The dashboard, rank-0 output, --pull (the script's globals), --timeout and Stop work as in
a %%kdist cell; a rank that raises (or exits with a non-zero status) is named.

kdist options:
"""

_HELP_LINE = re.compile(r"^\s*%kdist\s+run\s*\?{1,2}\s*$")


def usage() -> str:
    """The usage text with every kdist option (``%kdist run?``, ``%kdist run --help``)."""
    rows = []
    for flags, kwargs in specmod.OPTIONS:
        value = f" {kwargs['metavar']}" if kwargs.get("metavar") else ""
        rows.append(f"  {', '.join(flags)}{value}\n      {kwargs['help'].replace('%%', '%')}")
    return USAGE + "\n".join(rows)


def _takes_value() -> dict[str, bool]:
    return {flag: kwargs.get("action") != "store_true" for flags, kwargs in specmod.OPTIONS for flag in flags}


def split_line(rest: str) -> tuple[str, str, list[str]]:
    """``(kdist options, script path, script args)`` of what follows ``%kdist run``."""
    try:
        words = shlex.split(rest)
    except ValueError as exc:
        raise UsageError(f"%kdist run: cannot read the line ({exc})") from None
    known, options, i = _takes_value(), [], 0
    while i < len(words) and words[i].startswith("-"):
        word = words[i]
        flag = word.split("=", 1)[0]
        if flag not in known:
            raise UsageError(
                f"%kdist run: unknown option {word!r}; kdist's options come before "
                f"the script's path, the script's own after it (see %kdist run?)"
            )
        step = 2 if known[flag] and "=" not in word else 1
        if i + step > len(words):
            raise UsageError(f"%kdist run: {flag} needs a value (see %kdist run?)")
        options += words[i : i + step]
        i += step
    if i >= len(words):
        raise UsageError(
            "%kdist run: which script? Usage: %kdist run [kdist options] script.py [script args] (see %kdist run?)"
        )
    return shlex.join(options), words[i], words[i + 1 :]


def read_script(path: str) -> tuple[str, str]:
    """``(absolute path, source)``; a missing, unreadable or invalid script is a UsageError."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise UsageError(f"%kdist run: no such file: {path}")
    try:
        with open(full, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"%kdist run: cannot read {path} ({type(exc).__name__}: {exc})") from None
    try:
        compile(source, full, "exec")
    except (SyntaxError, ValueError) as exc:
        where = f", line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        raise UsageError(
            f"%kdist run: {path}{where}: {type(exc).__name__}: {getattr(exc, 'msg', exc)}; the script did not run"
        ) from None
    return full, source


#: where the script travels: a name in the kernel's namespace, --push-ed to engine ranks, so the
#: cell that runs it is one short line (a traceback's first frame shows that line, not the script)
SCRIPT_NAME = "_kdist_run_script"
CELL = f"__import__('kdist_magics.strategies.multiworker.run_script', fromlist=['run_main']).run_main(*{SCRIPT_NAME})"
_HOROVOD = re.compile(r"^\s*(import|from)\s+horovod\b", re.M)


def script_cell(rest: str, parse=None, user_ns=None) -> tuple[str, str] | None:
    """``(the %%kdist line, the cell)`` that runs the script; None when the help was asked
    for (and printed). ``parse``: checks the kdist options first (raises UsageError) and says
    which strategy they ask for; ``user_ns``: where the script is put for the cell."""
    from ... import messages

    words = rest.split()
    if words and words[0] in ("-h", "--help", "?", "??"):
        print(usage())
        return None
    line, path, argv = split_line(rest)
    spec = parse(line) if parse is not None else None  # kdist's options first, then the file
    full, source = read_script(path)
    if spec is not None and spec.strategy == "auto":  # a launcher script implies engines
        chosen = "horovod" if _HOROVOD.search(source) else "multiworker"
        messages.say(messages.run_chose(chosen, os.path.basename(full)))
        line = f"--strategy {chosen} {line}".strip()
        spec = parse(line)
    if spec is not None and spec.pull:
        for name in not_global(source, spec.pull):
            messages.say(messages.pull_not_global(name, os.path.basename(full)), warn=True)
    if spec is not None and specmod.KINDS.get(spec.strategy) == "engines":
        line = f"{line} --push {','.join([*spec.push, SCRIPT_NAME])}"  # the last --push counts
    if user_ns is not None:
        user_ns[SCRIPT_NAME] = (source, full, argv)
        return line, CELL
    return line, (
        f"__import__('kdist_magics.strategies.multiworker.run_script', "
        f"fromlist=['run_main']).run_main({source!r}, {full!r}, {argv!r})"
    )


def not_global(source: str, names) -> list[str]:
    """Of ``names``, those the script never binds at its top level (a global), in order:
    ``--pull`` brings back only the script's globals, not a ``main()``'s locals."""
    import ast

    tree = ast.parse(source)
    top = set()
    for node in tree.body:
        for sub in (
            ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else ()
        ):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                top.add(sub.id)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            top.update(
                [node.name] if hasattr(node, "name") else [(a.asname or a.name).split(".")[0] for a in node.names]
            )
    declared = {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
    return [n for n in names if n not in top and n not in declared]


def help_lines(lines: list[str]) -> list[str]:
    """An input transformer (IPython's cleanup stage): ``%kdist run?`` shows :func:`usage`
    (IPython would otherwise look up ``run`` and show its own ``%run``)."""
    return [
        "get_ipython().run_line_magic('kdist', 'run --help')\n" if _HELP_LINE.match(line) else line for line in lines
    ]


def run_main(source: str, path: str, argv: list[str]) -> None:  # runs on a rank
    """Run ``source`` as ``__main__`` in this rank's namespace (module doc)."""
    __tracebackhide__ = True
    import sys

    from IPython import get_ipython

    shell = get_ipython()
    ns = shell.user_ns if shell is not None else sys.modules["__main__"].__dict__
    saved = {k: ns[k] for k in ("__name__", "__file__") if k in ns}
    saved_argv, folder = sys.argv, os.path.dirname(path)
    ns["__name__"], ns["__file__"] = "__main__", path
    sys.argv = [path, *argv]
    sys.path.insert(0, folder)
    names = _fresh_keras_names()
    try:
        exec(compile(source, path, "exec"), ns)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            ours = [w.split("=", 1)[0] for w in argv if w.split("=", 1)[0] in _takes_value()]
            raise ScriptExited(
                f"{os.path.basename(path)} exited with status {exc.code!r}"
                + (
                    f"; {ours[0]} reached the script: kdist's options go before the "
                    f"script's path (%kdist run [kdist options] script.py [script "
                    f"args])"
                    if exc.code == 2 and ours
                    else ""
                )
            ) from None
    finally:
        names()
        sys.argv = saved_argv
        if folder in sys.path:
            sys.path.remove(folder)
        ns.pop("__file__", None)
        ns.update(saved)


def _fresh_keras_names():
    """Start Keras' automatic names afresh (module doc); returns what puts the counters back
    after the script: each the higher of before and after, so no later name repeats one."""
    from ..frameworks.compat_keras import keras_name_uids, set_keras_name_uids

    before = keras_name_uids()
    if before is None:  # Keras not imported yet: the script starts it afresh by itself
        return lambda: None
    set_keras_name_uids({})

    def restore() -> None:
        after = keras_name_uids() or {}
        set_keras_name_uids({k: max(before.get(k, 0), after.get(k, 0)) for k in {*before, *after}})

    return restore


def refuse_torch_code_elsewhere(cell: str, user_ns: dict) -> None:
    """Before a ``multiworker`` cell (or ``%kdist run``'s script) runs: code written for torchrun
    under another Keras backend is one line, and nothing starts."""
    from ...errors import StrategyUnavailable
    from ..frameworks.backends import keras_backend
    from ..processes.launcher_env import torch_code_elsewhere

    script = user_ns.get(SCRIPT_NAME) if SCRIPT_NAME in cell else None
    why = torch_code_elsewhere(script[0] if script else cell, keras_backend())
    if why is not None:
        raise StrategyUnavailable(why)
