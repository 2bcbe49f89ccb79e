"""Every snippet in README.md and docs/*.md runs, so the docs cannot drift from the code.

What counts as a snippet:

* a fenced ```python block: the python blocks of one file run in order, as one script,
  in a fresh interpreter (so a later block may use what an earlier one made);
* a fenced ```sh (or ```shell/```bash) block: each command runs with bash, and must exit 0;
* a line starting with ``$ `` in an untagged block (a transcript): the command runs, and
  must exit 0, or non-zero when the transcript shows an ``error:`` line.

Everything runs in a temporary directory holding links to ``examples/`` and ``bench/``,
with the virtualenv's ``bin`` first on ``PATH``. A block preceded by
``<!-- doc-test: skip: REASON -->`` is not run; the reason is required and listed by
``test_skipped_snippets_say_why``.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*doc-test:\s*skip:\s*(.+?)\s*-->\s*\Z", re.S)
SHELLS = ("sh", "shell", "bash")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


class Snippet:
    __slots__ = ("path", "line", "lang", "body", "skip")

    def __init__(self, path, line, lang, body, skip):
        self.path, self.line, self.lang, self.body, self.skip = path, line, lang, body, skip

    def __repr__(self):
        return f"{self.path.relative_to(REPO)}:{self.line}"


def snippets(path):
    text = path.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip()
        skip = SKIP.search(before[-300:])
        out.append(Snippet(path, text[:m.start()].count("\n") + 1, m.group(1).lower(),
                           m.group(2), skip.group(1) if skip else None))
    return out


ALL = [s for path in DOCS for s in snippets(path)]


def commands(snippet):
    """Shell commands of a snippet (continuation lines joined), with their expected outcome."""
    lines = snippet.body.splitlines()
    if snippet.lang in SHELLS:
        cmds, expect_error = [], False
        buf = ""
        for line in lines:
            buf += line.rstrip("\\") + " " if line.endswith("\\") else line
            if not line.endswith("\\"):
                if buf.strip() and not buf.strip().startswith("#"):
                    cmds.append(buf)
                buf = ""
        return [(c, expect_error) for c in cmds]
    if snippet.lang == "":
        cmds = [line[2:] for line in lines if line.startswith("$ ")]
        expect_error = any(re.search(r"(^|: )error: ", line) for line in lines)
        return [(c, expect_error) for c in cmds]
    return []


def _sandbox(tmp_path):
    for name in ("examples", "bench"):
        (tmp_path / name).symlink_to(REPO / name)
    env = dict(os.environ)
    env["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env["PATH"]
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("SSAEXEC_DOT", None)
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "")
    return env


PY_DOCS = sorted({s.path for s in ALL if s.lang == "python" and not s.skip},
                 key=lambda p: str(p))
SH = [s for s in ALL if commands(s) and not s.skip]
# a snippet that starts a process group (torchrun, ssaexec launch, the benchmark's --nproc)
# takes turns with the other tests that do under pytest-xdist (tests/conftest.py)
_GROUP = re.compile(r"\btorchrun\b|\bssaexec launch\b|--nproc\b")
SH_PARAMS = [pytest.param(s, marks=pytest.mark.processes) if _GROUP.search(s.body) else s
             for s in SH]


@pytest.mark.parametrize("path", PY_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_python_snippets_run(path, tmp_path):
    blocks = [s for s in snippets(path) if s.lang == "python" and not s.skip]
    script = "\n\n".join(f"# --- {s!r}\n{s.body}" for s in blocks)
    (tmp_path / "snippets.py").write_text(script, encoding="utf-8")
    proc = subprocess.run([sys.executable, "snippets.py"], cwd=tmp_path, env=_sandbox(tmp_path),
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"{path.name}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


@pytest.mark.parametrize("snippet", SH_PARAMS, ids=repr)
def test_shell_snippets_run(snippet, tmp_path):
    env = _sandbox(tmp_path)
    for cmd, expect_error in commands(snippet):
        proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300, stdin=subprocess.DEVNULL)
        ok = proc.returncode != 0 if expect_error else proc.returncode == 0
        assert ok, f"{snippet!r}: {cmd}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n" \
                   f"{proc.stderr[-3000:]}"


def test_every_snippet_is_seen():
    # the parser finds the blocks (a change in fence style would silently test nothing)
    assert len(ALL) > 20
    assert any(s.lang == "python" for s in ALL) and SH


def test_skipped_snippets_say_why():
    for s in ALL:
        if s.skip is not None:
            assert len(s.skip) > 10, f"{s!r}: say why the snippet cannot run"
