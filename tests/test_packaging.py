"""The sdist and the wheel, built as a release would be (PEP 517 hooks, offline): each carries
the LICENSE and the metadata, and the sdist holds no tests that could not run from it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LICENSE = (ROOT / "LICENSE").read_text()
# Build both with the setuptools of this venv (no isolation: no index is needed).
BUILD = ("import sys; from setuptools import build_meta as b; "
         "print(getattr(b, 'build_' + sys.argv[1])(sys.argv[2]))")
SKIP = shutil.ignore_patterns(".git", ".venv*", "venv", "build", "dist", "*.egg-info",
                              "__pycache__", ".*_cache", ".hypothesis")


def _build(kind: str, source: Path, out: Path) -> Path:
    proc = subprocess.run([sys.executable, "-c", BUILD, kind, str(out)], cwd=source,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist from a copy of the tree, the wheel from the unpacked sdist."""
    tmp = tmp_path_factory.mktemp("packaging")
    tree = tmp / "tree"
    shutil.copytree(ROOT, tree, ignore=SKIP)
    sdist = _build("sdist", tree, tmp)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", filter="data")
    (unpacked,) = (tmp / "unpacked").iterdir()
    wheel = _build("wheel", unpacked, tmp)
    return sdist, wheel


def test_the_license_is_apache_2_in_the_repository() -> None:
    assert "Apache License\n                           Version 2.0, January 2004" in LICENSE
    assert "END OF TERMS AND CONDITIONS" in LICENSE
    assert len(LICENSE.splitlines()) > 190  # the whole text, not a pointer to it


def test_the_sdist_carries_the_license_and_no_orphan_tests(built: tuple[Path, Path]) -> None:
    sdist, _ = built
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
        license_member = tar.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/LICENSE")
        assert license_member is not None
        assert license_member.read().decode() == LICENSE
    assert "meshroute_middleware/static/dashboard.html" in names
    tests = sorted(n for n in names if n.startswith("tests/") or Path(n).name.startswith("test_"))
    assert tests == []


def test_the_wheel_carries_the_license_and_the_metadata(built: tuple[Path, Path]) -> None:
    _, wheel = built
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        (license_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert whl.read(license_name).decode() == LICENSE
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = whl.read(metadata_name).decode()
    headers = metadata.split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
    assert "License-File: LICENSE" in headers
    assert "Author: meshroute developers" in headers
    assert "Classifier: Programming Language :: Python :: 3.11" in headers
    assert not [n for n in names if n.startswith("tests/") or "/test_" in n]
    assert "meshroute_middleware/static/dashboard.html" in names
