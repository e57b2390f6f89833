"""Issue 27 item 11: a user's model and dataset as a plain ``"module:factory"`` (a module
file, no package) next to the config, image-shaped inputs and the ``input_dim`` a model
factory gets for them, and the docs that say so (docs/writing-your-own.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docs_text
from tests.clitools import cli

REPO = Path(__file__).resolve().parents[1]

DATA = '''
import torch
from fedcore.data import Dataset


def images(*, seed, test_fraction):
    """Three classes of 1x8x8 images: the dataset keeps their shape."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (600,), generator=gen)
    x = torch.randn(600, 1, 8, 8, generator=gen) + y.view(-1, 1, 1, 1).float()
    n = int(len(y) * test_fraction)
    return Dataset(name="img", x_train=x[n:], y_train=y[n:], x_test=x[:n], y_test=y[:n],
                   num_classes=3)
'''

MODEL = """
from torch import nn


class Net(nn.Module):
    def __init__(self, input_dim, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4 * input_dim, num_classes)

    def forward(self, x):
        assert x.shape[1:] == (1, 8, 8), x.shape  # the batch as the dataset shaped it
        return self.head(self.conv(x).relu().flatten(1))


def make(*, input_dim, num_classes):
    assert input_dim == 64, input_dim  # 1 * 8 * 8: the features of one example, flattened
    return Net(input_dim, num_classes)
"""

CONFIG = """
[run]
rounds = 20
eval_every = 10

[topology]
kind = "ring"
nodes = 4

[algorithm]
name = "dpsgd"
lr = 0.05

[data]
dataset = "{prefix}data:images"

[model]
name = "{prefix}model:make"
"""


def _folder(tmp_path: Path, prefix: str) -> Path:
    """A folder with a config and the two module files it names, plain (no package)."""
    folder = tmp_path / "experiment"
    folder.mkdir()
    (folder / f"{prefix}data.py").write_text(DATA, encoding="utf-8")
    (folder / f"{prefix}model.py").write_text(MODEL, encoding="utf-8")
    (folder / "run.toml").write_text(CONFIG.format(prefix=prefix), encoding="utf-8")
    return folder


def test_plain_module_files_next_to_the_config(tmp_path: Path) -> None:
    """``fedcore simulate run.toml`` in the folder that holds ``*_data.py`` and
    ``*_model.py``: the plain form loads both, and a conv model sees 1x8x8 images."""
    folder = _folder(tmp_path, "i27_")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "fedcore", "simulate", "run.toml", "-q", "--out", "out"]
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads((folder / "out" / "summary.json").read_text(encoding="utf-8"))
    assert summary["status"] == "completed"
    assert summary["final"]["avg_model_accuracy"] > 0.5


def test_from_another_folder_the_error_says_where_fedcore_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path, "i27b_")
    for name in ("i27b_data", "i27b_model"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))  # sys.path is restored after the test
    monkeypatch.chdir(tmp_path)
    status, _, err = cli(capsys, "simulate", str(folder / "run.toml"), "-q", "--out", "o")
    assert status == 2 and "Traceback" not in err
    assert "cannot import module 'i27b_data'" in err
    assert "run it from the folder that holds i27b_data.py" in err and "PYTHONPATH" in err
    monkeypatch.syspath_prepend(str(folder))  # as PYTHONPATH=experiment would
    status, _, err = cli(capsys, "simulate", str(folder / "run.toml"), "-q", "--out", "o2")
    assert status == 0, err


def test_readme_documents_the_plain_form_input_dim_and_lr() -> None:
    section = docs_text.section("Your own model and data")
    assert '"module:factory"' in section
    assert "input_dim" in section and "1, 28, 28" in section and "nn.Flatten" in section
    assert "algorithm.lr" in section
