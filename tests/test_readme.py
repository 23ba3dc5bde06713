"""README.md is the front door: CI runs exactly its set-up and test commands. Every command in a ```bash block of
README.md and docs/*.md, and every relative link there, stays true."""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

import pytest

from gptcore import cli

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def readme_block(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_install_and_test_commands():
    install, test = readme_block("Set up and test")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert install in ci and test in ci
    assert ci.index(install) < ci.index(test)
    assert install.startswith("pip install torch==2.13.0")  # the CPU wheel before anything that needs torch


def test_the_main_job_is_the_gpu_tier_with_compare():
    assert readme_block("The main job")[0].startswith("pytest bench -m gpu --benchmark-compare")


# -- every command in a ```bash block ------------------------------------------------------------------------------

#: A placeholder (`<device>`, `...`) makes a line a sketch, not a command: such a line is skipped, on purpose.
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|…")
#: pytest options that take the next word as their value (the rest are flags, or carry their value after `=`).
PYTEST_VALUE_OPTIONS = {
    "-m",
    "-k",
    "-n",
    "--dist",
    "-p",
    "-c",
    "-o",
    "--benchmark-json",
    "--benchmark-storage",
    "--storage",
    "--benchmark-compare-fail",
    "--baselines-dir",
    "--gate-markdown",
    "--mem-tol",
    "--speed-tol",
    "--loss-tol",
    "--bench-warmup",
    "--bench-rounds",
    "--bench-steps",
    "--rootdir",
    "--results-log",
    "--resume",
    "--deadline",
    "--shard",
}
#: Kinds of command the checks know; anything else (pip, apt-get, git) is not checked.
KINDS = ("gptcore", "pytest", "script")


def bash_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for each line of each ```bash block; a line ending in a backslash is joined with the
    next (numbered by its first line)."""
    lines, block, pending = [], False, None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            block = line.strip() == "```bash" if not block else False
            continue
        if not block or (pending is None and not line.strip()):
            continue
        start, joined = pending or (number, "")
        joined += line.rstrip()
        if joined.endswith("\\"):
            pending = (start, joined[:-1] + " ")
            continue
        pending = None
        lines.append((start, joined.strip()))
    return lines


def simple_commands(line: str) -> list[list[str]]:
    """The commands of one shell line, as words: split at && || ; | and parentheses, comments dropped, leading
    VAR=value assignments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words = [], []
    for token in lexer:
        if set(token) <= set("();<>|&"):
            commands.append(words)
            words = []
        else:
            words.append(token)
    commands.append(words)
    result = []
    for words in commands:
        while words and re.match(r"[A-Za-z_]\w*=", words[0]):
            words = words[1:]
        if words:
            result.append(words)
    return result


def markers() -> set[str]:
    """pyproject.toml's pytest markers (read as text: tomllib needs Python 3.11, the project allows 3.10)."""
    block = (ROOT / "pyproject.toml").read_text().split("\nmarkers = [", 1)[1].split("]", 1)[0]
    return set(re.findall(r'^\s*"([\w-]+):', block, re.M))


def gpu_session_stages() -> set[str]:
    """The stages scripts/gpu_session.sh accepts: the labels of its `case "$stage" in` statement."""
    text = (ROOT / "scripts" / "gpu_session.sh").read_text()
    block = text.split('case "$stage" in', 1)[1].split("esac", 1)[0]
    labels = re.findall(r"^\s*([\w|-]+)\)", block, re.M)
    return {stage for label in labels for stage in label.split("|")}


def preset_problems(models: list[str], recipes: list[str]) -> list[str]:
    """Each name is a registered model or recipe, looked up as the CLI looks it up; a renamed recipe (which still
    runs, with a FutureWarning) is stale in a document."""
    problems = []
    for lookup, names in ((cli.get_model, models), (cli.get_recipe, recipes)):
        for name in names:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    lookup(name)
            except (ValueError, Warning) as err:
                problems.append(str(err).splitlines()[0])
    return problems


def check_gptcore(words: list[str]) -> list[str]:
    """`python -m gptcore ARGS`: parsed by the CLI's own parser; --model, --recipe and every --set as the CLI
    resolves them."""
    try:
        args = cli._parser().parse_args(words)
    except SystemExit as err:
        return [f"the parser exited (code {err.code})"]
    except cli.UsageError as err:
        return [f"the parser refuses it: {err}"]
    if not hasattr(args, "model"):
        return []
    problems = preset_problems([args.model], [args.recipe])
    if not problems:
        try:
            cli.apply_assignments(cli.get_recipe(args.recipe), args.assignments)
        except (cli.UsageError, ValueError) as err:
            problems.append(f"--set: {err}")
    return problems


def check_pytest(words: list[str]) -> list[str]:
    """`pytest ARGS`: every path exists (a ::node suffix stripped), every name in a -m expression is a marker."""
    problems, known, i = [], markers(), 0
    while i < len(words):
        word = words[i]
        if word.startswith("-"):
            name, eq, value = word.partition("=")
            if name in PYTEST_VALUE_OPTIONS and not eq:
                value, i = (words[i + 1] if i + 1 < len(words) else ""), i + 1
            if name == "-m":
                unknown = set(re.findall(r"\w+", value)) - {"and", "or", "not"} - known
                problems += [f"-m {value!r}: {m!r} is not a marker in pyproject.toml" for m in sorted(unknown)]
        elif not (ROOT / word.split("::", 1)[0]).exists():
            problems.append(f"no such path: {word}")
        i += 1
    return problems


def check_script(words: list[str]) -> list[str]:
    """`bash scripts/X.sh ARGS` or `python scripts/X.py ARGS`: the script exists, gpu_session.sh's stage is one it
    accepts, and any --model/--recipe/--recipes names a registered preset."""
    script = words[1]
    if not (ROOT / script).is_file():
        return [f"no such script: {script}"]
    problems = []
    if script == "scripts/gpu_session.sh":
        stages = words[2].split(",") if len(words) > 2 else [None]  # stages named together: smoke,ladder
        for stage in stages:
            if stage not in gpu_session_stages():
                problems.append(f"scripts/gpu_session.sh has no stage {stage!r}: {sorted(gpu_session_stages())}")
    return problems + preset_problems(*named_presets(words[2:]))


def named_presets(words: list[str]) -> tuple[list[str], list[str]]:
    """The models and recipes named by --model X, --recipe Y, --recipes Y Z (or --model=X)."""
    models, recipes, option = [], [], None
    for word in words:
        if word.startswith("-"):
            name, eq, value = word.partition("=")
            option = name if name in ("--model", "--recipe", "--recipes") else None
            word = value if eq else None
            if word is None:
                continue
        if option == "--model":
            models.append(word)
        elif option in ("--recipe", "--recipes"):
            recipes.append(word)
        if option != "--recipes":
            option = None
    return models, recipes


def check_command(words: list[str]) -> tuple[str | None, list[str]]:
    """(the kind of command, its problems); kind None for a command the checks do not know."""
    if words[0] == "python" and words[1:3] == ["-m", "gptcore"]:
        return "gptcore", check_gptcore(words[3:])
    if words[0] == "torchrun" and "gptcore" in words:  # torchrun [its options] -m gptcore ARGS
        at = words.index("gptcore")
        if words[at - 1] == "-m":
            return "gptcore", check_gptcore(words[at + 1 :])
    if words[0] == "pytest" or words[:3] == ["python", "-m", "pytest"]:
        return "pytest", check_pytest(words[1 if words[0] == "pytest" else 3 :])
    if words[0] in ("bash", "python") and len(words) > 1 and words[1].startswith("scripts/"):
        return "script", check_script(words)
    return None, []


def check_page(path: Path) -> tuple[dict[str, int], list[str]]:
    """How many commands of each kind a page's ```bash blocks hold, and every problem, as 'file:line: ...'."""
    counts, problems = dict.fromkeys(KINDS, 0), []
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for number, line in bash_lines(path.read_text()):
        if PLACEHOLDER.search(line):  # a sketch with placeholders, not a command: skipped on purpose
            continue
        for words in simple_commands(line):
            kind, found = check_command(words)
            if kind:
                counts[kind] += 1
            problems += [f"{name}:{number}: {shlex.join(words)}: {problem}" for problem in found]
    return counts, problems


def test_every_command_in_the_readme_and_docs_parses_and_names_what_exists():
    counts, problems = dict.fromkeys(KINDS, 0), []
    for page in PAGES:
        page_counts, page_problems = check_page(page)
        counts = {kind: counts[kind] + page_counts[kind] for kind in KINDS}
        problems += page_problems
    assert not problems, "\n".join(problems)
    # the floors: a change that stops the checks from finding the commands must not pass by checking nothing
    assert counts["gptcore"] >= 15 and counts["pytest"] >= 8 and counts["script"] >= 5, counts


# -- every relative link -------------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", path.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def link_problems(path: Path, root: Path = ROOT) -> tuple[int, list[str]]:
    """How many relative links a page has, and those that leave the repository (``root``) or point at nothing."""
    checked, problems = 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
                continue
            checked += 1
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.is_relative_to(root):
                problems.append(f"{path.name}:{number}: {target} is outside the repository")
            elif not resolved.exists():
                problems.append(f"{path.name}:{number}: {target} does not exist")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{path.name}:{number}: {target}: no heading #{anchor} in {file or path.name}")
    return checked, problems


def test_every_relative_link_in_the_readme_and_docs_exists_in_the_repository():
    checked, problems = 0, []
    for page in PAGES:
        n, found = link_problems(page)
        checked, problems = checked + n, problems + found
    assert not problems, "\n".join(problems)
    assert checked >= 20


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in readme] == []


#: A repository path in backticks: a file with a known extension, or a folder (a trailing slash).
REPO_PATH = re.compile(
    r"`((?:gptcore|bench|tests|scripts|docs|\.github|\.ci)/[\w./-]*"
    r"(?:/|\.(?:py|md|json|sh|yml|txt|gz)))`"
)


def test_every_repository_path_in_backticks_exists():
    """`gptcore/measure/work.py`, `scripts/gpu_session.sh`: a path the pages name in code is there."""
    named = [(page.relative_to(ROOT), p) for page in PAGES for p in REPO_PATH.findall(page.read_text())]
    missing = [f"{page}: {p}" for page, p in named if not (ROOT / p).exists()]
    assert not missing, "\n".join(missing)
    assert len(named) >= 30


# -- the checks can fail -------------------------------------------------------------------------------------------


def test_the_checks_catch_planted_wrong_commands_and_links(tmp_path):
    page = tmp_path / "planted.md"
    page.write_text(
        "\n".join(
            [
                "# Planted",
                "",
                "```bash",
                "python -m gptcore train --model cpu-small --recipe ckpt-fp32 --steps 5",  # 4: right
                "python -m gptcore train --model cpu-small --recipe no-such-recipe",  # 5
                "python -m gptcore estimate --model no-such-model",  # 6
                "python -m gptcore train --model cpu-small --stepz 5",  # 7
                "python -m gptcore train --model cpu-small --recipe fused-optim",  # 8: renamed, still runs, stale
                "python -m gptcore train --model cpu-small --set no_such_field=1",  # 9
                "pytest tests -n 2 && pytest bench/test_no_such_study.py::test_x -m cpu",  # 10
                "pytest bench -m 'cpu and not no_such_marker'",  # 11
                "bash scripts/gpu_session.sh smoke,no-such-stage",  # 12
                "python scripts/no_such_script.py",  # 13
                "torchrun --nproc-per-node=2 \\",  # 14, continued
                "  -m gptcore train --model gpt2 --recipe no-such-recipe",
                "python -m gptcore report <run>.json",  # 16: a placeholder, skipped
                "```",
                "",
                "[gone](no-such-page.md) and [away](../../outside.md) and [here](planted.md#no-such-heading)",
            ]
        )
        + "\n"
    )
    counts, problems = check_page(page)
    assert counts == {"gptcore": 7, "pytest": 3, "script": 2}
    lines = [int(p.split(":")[1]) for p in problems]
    assert lines == [5, 6, 7, 8, 9, 10, 11, 12, 13, 14], "\n".join(problems)
    assert "no-such-recipe" in problems[0] and "--stepz" in problems[2] and "fused-optim" in problems[3]
    assert "test_no_such_study.py" in problems[5] and "no_such_marker" in problems[6]
    _, broken = link_problems(page, root=tmp_path)
    assert len(broken) == 3 and "does not exist" in broken[0] and "outside" in broken[1] and "#no-such" in broken[2]
