"""The commands README.md and docs/ show work as written. They are checked, not run: they start
clusters, run for minutes, or need several hosts.

- A ``handoff …`` line of an ``sh`` block is parsed by the real CLI, run with ``--help``
  appended: clap reads every argument before it, so a wrong subcommand, an unknown option or a
  bad value fails, and ``--help`` then prints the help instead of running anything.
- An inline code span that is a ``handoff …`` command may be a synopsis (``[--json]``,
  ``NAME``): each option it names must be in the help of the subcommand it names.
- ``python -m handoff.worker …``: each option is in the worker's ``--help``.
- A script of the repository (``./scripts/demo``, ``bench/peers/run``, ``bench/lab.py``) must
  exist, and each option must appear in it or in a file beside it (where its parser is).
- ``cargo … -p CRATE [--example E] [--bin B]``: the crate, its example and its binary exist.
- Anything else must be one of :data:`OUTSIDE`, tools the guides use as they are.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from conftest import _find_handoff_bin
from markdown_docs import REPO, code_blocks, guide_files, inline_code, rel

#: Programs from outside the repository that a guide may name unchecked.
OUTSIDE = {"python3", "pip", "sudo", "ip", "dask", "git"}
#: Binaries the workspace builds besides ``handoff``, by the crate whose sources hold their options.
WORKSPACE_BINARIES = {"delay-line": "crates/handoff-testkit"}
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_OPERATORS = {"&&", "||", ";", "|"}


def commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line: comments dropped, split at ``&&``, ``||``, ``;``,
    ``|``, and leading ``NAME=value`` assignments left out."""
    words = shlex.split(line, comments=True)
    out, current = [], []
    for w in [*words, ";"]:
        if w in _OPERATORS:
            while current and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", current[0]):
                current.pop(0)
            if current:
                out.append(current)
            current = []
        else:
            current.append(w)
    return out


def shell_lines(text: str) -> list[str]:
    """The logical lines of an ``sh`` block (``\\`` continuations joined)."""
    return [line for line in text.replace("\\\n", " ").splitlines() if line.strip()]


@cache
def handoff_help(path: tuple[str, ...]) -> str:
    """``handoff PATH… --help``, or ``""`` where that is no subcommand."""
    out = subprocess.run([str(_handoff()), *path, "--help"], capture_output=True, text=True, timeout=30)
    return out.stdout if out.returncode == 0 else ""


@cache
def worker_help() -> str:
    out = subprocess.run([sys.executable, "-m", "handoff.worker", "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


@cache
def _handoff() -> Path:
    """The Rust binary, found as the ``handoff_bin`` fixture finds it (``$HANDOFF_BIN``, a build)."""
    return _find_handoff_bin()


def _subcommands(help_text: str) -> set[str]:
    """The subcommands a clap help lists under ``Commands:``."""
    names, inside = set(), False
    for line in help_text.splitlines():
        if line.startswith("Commands:"):
            inside = True
        elif inside and re.match(r"^  [a-z]", line):
            names.add(line.split()[0])
        elif inside and line and not line.startswith(" "):
            inside = False
    return names


def check_handoff(args: list[str], synopsis: bool) -> list[str]:
    """Problems with ``handoff ARGS``: parsed by the CLI, or (a synopsis) options looked up."""
    if not synopsis:
        out = subprocess.run([str(_handoff()), *args, "--help"], capture_output=True, text=True, timeout=30)
        return [] if out.returncode == 0 else [out.stderr.strip().splitlines()[0]]
    path: list[str] = []
    for word in args:
        if word in _subcommands(handoff_help(tuple(path))):
            path.append(word)
        elif not word.startswith("-"):
            break
    helps = "".join(handoff_help(tuple(path[:i])) for i in range(1, len(path) + 1))
    if not path:
        return [f"no subcommand in handoff {' '.join(args)}"]
    return [f"handoff {' '.join(path)} has no {o}" for o in _OPTION.findall(" ".join(args)) if o not in helps]


def check_script(prog: str, args: list[str]) -> list[str]:
    """Problems with a script of the repository: it exists, and its options are in it or beside it."""
    path = REPO / prog.removeprefix("./")
    if not path.is_file():
        return [f"{prog} does not exist"]
    text = "".join(p.read_text(errors="replace") for p in [path, *path.parent.glob("*.py")] if p.is_file())
    if "argparse" in text:
        text += "--help"  # argparse adds it
    own, _, inner = " ".join(args).partition(" -- ")
    problems = [f"{prog} has no {o}" for o in _OPTION.findall(own) if o not in text]
    if inner:  # scripts/netlab exec 2 -- handoff node …
        problems += check_command(inner.split(), synopsis=True)
    return problems


def check_cargo(args: list[str]) -> list[str]:
    """Problems with ``cargo …``: the package of ``-p``, its ``--example`` and ``--bin`` exist."""
    problems = []
    opts = dict(zip(args, args[1:]))
    crates = {re.search(r'(?m)^name = "([^"]+)"', p.read_text())[1]: p.parent for p in REPO.glob("crates/*/Cargo.toml")}
    crate = opts.get("-p")
    if crate and crate not in crates:
        return [f"no crate {crate} in crates/"]
    if crate and "--example" in opts and not (crates[crate] / "examples" / f"{opts['--example']}.rs").exists():
        problems.append(f"{crate} has no example {opts['--example']}")
    if crate and "--bin" in opts and f'name = "{opts["--bin"]}"' not in (crates[crate] / "Cargo.toml").read_text():
        if not (crates[crate] / "src" / "bin" / f"{opts['--bin']}.rs").exists():
            problems.append(f"{crate} has no binary {opts['--bin']}")
    return problems


def check_command(words: list[str], synopsis: bool) -> list[str]:
    """Problems with one simple command, as the module's doc says."""
    prog, args = words[0], words[1:]
    if prog == "handoff" or re.fullmatch(r"(\./)?target/(debug|release)/handoff", prog):
        return check_handoff(args, synopsis)
    if prog in WORKSPACE_BINARIES:
        text = "".join(p.read_text() for p in (REPO / WORKSPACE_BINARIES[prog]).rglob("*.rs"))
        return [f"{prog} has no {o}" for o in _OPTION.findall(" ".join(args)) if o not in text]
    if prog == "cargo":
        return check_cargo(args)
    if re.search(r"(^|/)python3?$", prog):
        if args[:2] == ["-m", "handoff.worker"]:
            return [
                f"python -m handoff.worker has no {o}"
                for o in _OPTION.findall(" ".join(args))
                if o not in worker_help()
            ]
        if args[:1] == ["-c"] and not synopsis:
            out = subprocess.run([sys.executable, *args[:2]], cwd=REPO, capture_output=True, text=True, timeout=60)
            return [] if out.returncode == 0 else [f"python -c {args[1]!r} failed: {out.stderr[-300:]}"]
        if args and args[0].endswith(".py"):
            return check_script(args[0], args[1:])
        return []
    if prog.startswith(".venv/"):
        return []
    if "/" in prog:
        return check_script(prog, args)
    if prog in OUTSIDE:
        return []
    return [f"{prog} is neither the repository's nor a known outside tool ({sorted(OUTSIDE)})"]


SH_LINES = [
    (f"{b.where}+{i}", line)
    for p in guide_files()
    for b in code_blocks(p)
    if b.lang == "sh"
    for i, line in enumerate(shell_lines(b.text))
]


@pytest.mark.parametrize("where,line", SH_LINES, ids=[w for w, _ in SH_LINES])
def test_shell_block_line_works_as_written(where, line):
    problems = [p for words in commands(line) for p in check_command(words, synopsis=False)]
    assert not problems, f"{where}: {line}\n" + "\n".join(problems)


def _is_command(span: str) -> bool:
    return bool(
        re.match(r"^(handoff [a-z]|python -m handoff\.worker|\.?/?scripts/\S|bench/\S+ |cargo |delay-line )", span)
    )


SPANS = [(f"{rel(p)}:{n}", span) for p in guide_files() for n, span in inline_code(p) if _is_command(span)]


@pytest.mark.parametrize("where,span", SPANS, ids=[f"{w} {s[:40]}" for w, s in SPANS])
def test_inline_command_names_real_options(where, span):
    words = span.replace("…", " ").replace("...", " ").split()
    problems = check_command(words, synopsis=True)
    assert not problems, f"{where}: {span}\n" + "\n".join(problems)


def test_the_checker_finds_a_wrong_option_and_a_missing_script():
    """The checks above can fail."""
    assert check_command(["handoff", "node", "--no-such-option"], synopsis=False)
    assert check_command(["handoff", "nodes"], synopsis=False)
    assert check_command(["handoff", "bench", "--reps", "ten"], synopsis=False)
    assert check_command(["handoff", "chaos", "[--no-such-option]"], synopsis=True)
    assert check_command(["./scripts/no-such-script"], synopsis=False)
    assert check_command(["scripts/fuzz", "--no-such-option"], synopsis=False)
    assert check_command(["python", "-m", "handoff.worker", "--no-such-option"], synopsis=True)
    assert check_command(["cargo", "run", "-p", "handoff", "--example", "nothing"], synopsis=True)
    assert check_command(["rm", "-rf", "x"], synopsis=False)
    assert not check_command(["handoff", "node", "--name", "a", "--listen", "127.0.0.1:0"], synopsis=False)


def _every_option() -> str:
    """The help of every ``handoff`` subcommand and of the Python worker, and the scripts' text."""
    helps = [worker_help()]
    for sub in _subcommands(handoff_help(())):
        helps.append(handoff_help((sub,)))
        helps += [handoff_help((sub, inner)) for inner in _subcommands(handoff_help((sub,)))]
    scripts = [p for p in (REPO / "scripts").iterdir() if p.is_file()] + list((REPO / "bench").rglob("*.py"))
    return (
        "".join(helps)
        + "".join(p.read_text(errors="replace") for p in scripts)
        + (REPO / "bench/peers/run").read_text()
    )


OPTION_SPANS = [(f"{rel(p)}:{n}", span) for p in guide_files() for n, span in inline_code(p) if _OPTION.match(span)]


def test_every_option_named_alone_exists():
    """An option named on its own (``--max-buffered-bytes``) is one of a command of the repository."""
    known = _every_option()
    missing = [f"{w}: {s}" for w, s in OPTION_SPANS for o in _OPTION.findall(s) if o not in known]
    assert not missing, "options no command has:\n" + "\n".join(missing)
