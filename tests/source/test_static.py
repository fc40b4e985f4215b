"""The static source's YAML loader: libyaml when PyYAML has it, the same documents either way."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.source import yamlload
from app.source.static import ManifestError, parse_manifests, read_manifests
from tests.support import ROOT


def test_libyaml_is_used_when_pyyaml_has_it() -> None:
    expected = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
    assert yamlload.LOADER is expected


@pytest.mark.parametrize(
    "directory",
    [
        pytest.param(ROOT / "manifests", id="manifests"),
        pytest.param(ROOT / "tests", id="tests"),
    ],
)
def test_libyaml_and_the_pure_loader_read_the_same_objects(directory: Path) -> None:
    files = sorted(p for p in directory.rglob("*") if p.suffix in (".yaml", ".yml"))
    assert files
    for path in files:
        text = path.read_text()
        pure = list(yaml.load_all(text, Loader=yaml.SafeLoader))
        assert list(yaml.load_all(text, Loader=yamlload.LOADER)) == pure, path


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("kind: Role\nmetadata: {name: [\n", id="unclosed-flow"),
        pytest.param("a: b\n  c: d\n", id="bad-indentation"),
        pytest.param("- !!python/object:os.system ls\n", id="python-tag"),
    ],
)
def test_malformed_yaml_is_a_manifest_error(text: str, tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"^here: "):
        parse_manifests(text, "here")
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ManifestError, match=r"bad\.yaml: "):
        read_manifests(tmp_path)
