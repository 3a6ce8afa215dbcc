"""The local task bank: small generated Python repositories, one injected bug each, from a seed.

Task `i` of seed `s` is a package with three modules of the library's functions, a visible test
suite (tests/test_<module>.py) and one bug injected into one function. The target function's
cases the bug gets wrong become the hidden fail-to-pass tests (tests/test_issue.py, added only at
grading); every other case is a visible pass-to-pass test. Expected values come from running the
correct code, the problem statement from running the buggy code. Same seed, same bank.
"""

from __future__ import annotations

import difflib
import random
from functools import cache

from examples.swe.library import MODULES, Function, Mutation
from examples.swe.task import Task

BANK_SIZE = 300
_PREFIXES = ("tidy", "swift", "plain", "micro", "handy", "small", "quick", "neat", "lean", "bright")
_SUFFIXES = ("kit", "utils", "tools", "lib", "box", "core", "bits", "ops")

PYPROJECT = """[project]
name = "{pkg}"
version = "0.1.0"

[tool.pytest.ini_options]
pythonpath = ["."]
testpaths = ["tests"]
"""


def _run(source: str, name: str, args: str):
    scope: dict = {}
    exec(source, scope)  # the library's own code, never an agent's
    try:
        return repr(eval(f"{name}({args})", scope))
    except Exception as e:  # a bug may raise: the test then fails with that error
        return f"raises {type(e).__name__}"


@cache
def _outcomes(func: Function, mutation: Mutation | None) -> tuple[str, ...]:
    source = func.source if mutation is None else _mutate(func, mutation)
    return tuple(_run(source, func.name, args) for args in func.cases)


def broken_cases(func: Function, mutation: Mutation) -> list[int]:
    """The indexes of the cases a mutation gets wrong."""
    pairs = zip(_outcomes(func, mutation), _outcomes(func, None), strict=True)
    return [k for k, (bug, right) in enumerate(pairs) if bug != right]


def _mutate(func: Function, mutation: Mutation) -> str:
    if func.source.count(mutation.old) != 1:
        raise ValueError(f"{func.name}: mutation text {mutation.old!r} must occur exactly once")
    return func.source.replace(mutation.old, mutation.new)


def _module_text(funcs: list[Function], override: dict[str, str]) -> str:
    return "\n\n".join(override.get(f.name, f.source) for f in funcs)


def _test_text(pkg: str, module: str, cases: list[tuple[Function, int]]) -> str:
    lines = [f"from {pkg}.{module} import *  # noqa: F403\n"]
    for func, k in cases:
        args, expected = func.cases[k], _outcomes(func, None)[k]
        lines.append(f"\n\ndef test_{func.name}_{k}():\n    assert {func.name}({args}) == {expected}\n")
    return "".join(lines)


def _diff(path: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile="/dev/null" if not before else f"a/{path}",
            tofile=f"b/{path}",
        )
    )


def make_task(index: int, seed: int = 0) -> Task:
    rng = random.Random(f"agl-swe:{seed}:{index}")
    pkg = rng.choice(_PREFIXES) + rng.choice(_SUFFIXES)
    modules = sorted(rng.sample(sorted(MODULES), 3))
    layout = {
        m: sorted(rng.sample(MODULES[m], min(len(MODULES[m]), rng.randint(3, 4))), key=lambda f: f.name)
        for m in modules
    }
    target_module = rng.choice(modules)
    target = rng.choice(layout[target_module])
    # Only mutations that break some cases and keep at least one (so the statement has a contrast).
    # Only mutations that break some cases (the library's test checks each keeps others right).
    mutation = rng.choice([m for m in target.mutations if broken_cases(target, m)])
    wrong = broken_cases(target, mutation)

    files = {
        "pyproject.toml": PYPROJECT.format(pkg=pkg),
        "README.md": f"# {pkg}\n\nSmall helpers: {', '.join(modules)}. Run the tests with `python -m pytest`.\n",
        f"{pkg}/__init__.py": f'"""{pkg}: small helpers."""\n',
        "tests/__init__.py": "",
    }
    p2p, f2p = [], []
    for m in modules:
        buggy = {target.name: _mutate(target, mutation)} if m == target_module else {}
        files[f"{pkg}/{m}.py"] = _module_text(layout[m], buggy)
        visible = [(f, k) for f in layout[m] for k in range(len(f.cases)) if not (f is target and k in wrong)]
        files[f"tests/test_{m}.py"] = _test_text(pkg, m, visible)
        p2p += [f"tests/test_{m}.py::test_{f.name}_{k}" for f, k in visible]
    hidden = {"tests/test_issue.py": _test_text(pkg, target_module, [(target, k) for k in wrong])}
    f2p = [f"tests/test_issue.py::test_{target.name}_{k}" for k in wrong]

    path = f"{pkg}/{target_module}.py"
    fixed = _module_text(layout[target_module], {})
    k = wrong[0]
    statement = (
        f"`{target.name}` in `{path}` gives a wrong result.\n\n"
        f"`{target.name}({target.cases[k]})` returns {_outcomes(target, mutation)[k]}, "
        f"but it should return {_outcomes(target, None)[k]}.\n"
        f"What it should do: {target.source.split(chr(34) * 3)[1]}\n"
    )
    return Task(
        instance_id=f"agl-swe__{pkg}.{mutation.family}__{seed}_{index:04d}",
        repo=f"agl-bank/{pkg}",
        problem_statement=statement,
        patch=_diff(path, files[path], fixed),
        test_patch=_diff("tests/test_issue.py", "", hidden["tests/test_issue.py"]),
        FAIL_TO_PASS=tuple(f2p),
        PASS_TO_PASS=tuple(p2p),
        version="1",
        files=files,
        hidden_files=hidden,
        family=mutation.family,
    )


def bank(seed: int = 0, size: int = BANK_SIZE) -> list[Task]:
    return [make_task(i, seed) for i in range(size)]


def find(instance_id: str, size: int = BANK_SIZE) -> Task:
    """The bank task with this id (its seed and index are in the id)."""
    try:
        seed, index = instance_id.rsplit("__", 1)[1].split("_")
        task = make_task(int(index), int(seed))
    except (IndexError, ValueError):
        raise KeyError(
            f"no task {instance_id!r} in the bank (ids look like agl-swe__PKG.FAMILY__SEED_NNNN)"
        ) from None
    if task.instance_id != instance_id or int(index) >= size:
        raise KeyError(f"no task {instance_id!r} in the bank")
    return task
