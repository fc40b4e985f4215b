"""Packaging: the project builds into a wheel that ships only ``app`` and installs working
console scripts, including the kubectl plugin ``kubectl-label_rbac``.

The build runs on a copy of the checkout (so nothing is written into it) with the test
interpreter's setuptools; the install goes into a fresh venv that borrows the test venv's
site-packages for the dependencies, so nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import app
from tests.conftest import EXAMPLES
from tests.support import ROOT

IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.pyc", "build", "*.egg-info", "dev-certs", ".*_cache"
)


def run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, **kwargs
    )  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("build")
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=IGNORED, symlinks=True)
    out = tmp / "dist"
    result = run(
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--no-index", "--wheel-dir", out, source,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (built,) = out.glob("label_rbac-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("venv") / "venv"
    assert run(sys.executable, "-m", "venv", "--without-pip", target).returncode == 0
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(run(target / "bin" / "python", "-c", where).stdout.strip())
    # The dependencies come from the test venv; the package itself only from the wheel.
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    result = run(
        sys.executable, "-m", "pip", "--python", target / "bin" / "python", "install",
        "--quiet", "--no-deps", "--no-index", wheel,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return target


def test_wheel_ships_only_the_app_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(f"label_rbac-{app.__version__}.dist-info/entry_points.txt")
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"app", f"label_rbac-{app.__version__}.dist-info"}
    assert "app/engine/labels.py" in names
    assert b"kubectl-label_rbac = app.cli:plugin_main" in entry_points
    assert b"kubectl_complete-label_rbac = app.cli:plugin_complete" in entry_points


def test_console_script_runs_from_the_installed_package(venv: Path, tmp_path: Path) -> None:
    script = venv / "bin" / "kubectl-label_rbac"
    version = run(script, "--version", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"label-rbac {app.__version__}"
    where = run(venv / "bin" / "python", "-c", "import app; print(app.__file__)", cwd=tmp_path)
    assert where.stdout.startswith(str(venv)), where.stdout
    check = run(
        script, "check", "--rbac-dir", EXAMPLES, "--as", "bob", "--verb", "create",
        "--resource", "configmaps", "-n", "t1", "-l", "team=a", cwd=tmp_path,
    )  # fmt: skip
    assert check.returncode == 1, check.stderr
    assert 'label team="a" is not permitted' in check.stdout


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_finds_the_plugin(venv: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["KUBECONFIG"] = str(tmp_path / "none")  # plugins run without a cluster
    result = run("kubectl", "label-rbac", "--version", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"label-rbac {app.__version__}"
    usage = run("kubectl", "label-rbac", "--help", env=env, cwd=tmp_path)
    assert usage.stdout.startswith("usage: kubectl label-rbac")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_completes_the_installed_plugin(venv: Path, tmp_path: Path) -> None:
    """``kubectl label-rbac <TAB>``: the shell asks ``kubectl __complete``, which runs the
    installed ``kubectl_complete-label_rbac`` with the words after the plugin's name."""
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["KUBECONFIG"] = str(tmp_path / "none")
    result = run("kubectl", "__complete", "label-rbac", "who-can", "", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    *candidates, directive = result.stdout.splitlines()
    assert {"get", "create", "bind", "impersonate"} <= {c.split("\t")[0] for c in candidates}
    assert directive == ":4"
