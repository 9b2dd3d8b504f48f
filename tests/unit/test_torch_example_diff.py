"""A plain PyTorch loop becomes a Shoal program in at most 8 changed lines: the examples'
plain, Shoal and DDP versions of one MNIST program differ by the counts docs/pytorch.md states."""

import ast
import difflib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def code_lines(path: Path) -> list[str]:
    """The program's lines after its module docstring (which describes each file)."""
    text = path.read_text()
    docstring = ast.parse(text).body[0]
    return text.splitlines()[docstring.end_lineno:]


def changed(before: str, after: str) -> tuple[int, int]:
    """(+added, -removed) lines, a modified line counting once each way, as `git diff --stat`."""
    diff = list(difflib.unified_diff(code_lines(REPO / before), code_lines(REPO / after), n=0, lineterm=""))[2:]
    return (sum(line.startswith("+") for line in diff), sum(line.startswith("-") for line in diff))


@pytest.mark.parametrize("version, label", [("examples/mnist_mlp_torch.py", "Shoal"),
                                            ("examples/mnist_mlp_ddp.py", "DDP")])
def test_doc_states_the_changed_lines_of_each_version(version, label):
    added, removed = changed("examples/mnist_mlp_plain.py", version)
    doc = (REPO / "docs" / "pytorch.md").read_text()
    assert f"| {label} | `{version}` | +{added}/−{removed} |" in doc


def test_shoal_version_changes_at_most_8_lines_of_the_plain_loop():
    added, removed = changed("examples/mnist_mlp_plain.py", "examples/mnist_mlp_torch.py")
    assert added <= 8 and removed <= 8


@pytest.mark.parametrize("heading, version", [("The Shoal version:", "examples/mnist_mlp_torch.py"),
                                              ("The DDP version:", "examples/mnist_mlp_ddp.py")])
def test_every_line_the_docs_diff_shows_is_in_the_files(heading, version):
    doc = (REPO / "docs" / "pytorch.md").read_text()
    block = doc.split(heading, 1)[1].split("```diff\n", 1)[1].split("```", 1)[0]
    plain, changed_version = (REPO / "examples/mnist_mlp_plain.py").read_text(), (REPO / version).read_text()
    for line in block.splitlines():
        if line.startswith(("-", "+")):
            assert line[1:] in (plain if line[0] == "-" else changed_version).splitlines(), line
