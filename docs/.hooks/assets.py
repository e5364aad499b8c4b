"""MkDocs hook: the browser libraries the site needs, fetched from the npm registry at pinned versions.

The repository carries no third-party code, and a reader's browser never asks a
CDN for anything. So KaTeX (math) and Mermaid (diagrams) come from the npm
registry as the tarballs their maintainers published, at the versions pinned
below, checked against the sha512 `dist.integrity` the registry publishes for
that version (pinned here too: a tarball that changes fails the build), cached
outside the repository, and added to the build under `assets/vendor/`.

The first build needs the network once; later builds, `mkdocs serve` and CI
with a restored cache do not. Offline with an empty cache, the build stops with
a message that says which file to fetch and where to put it.

Cache: $LLM_BANK_CACHE_DIR, else $XDG_CACHE_HOME/llm-inference-interview-bank,
else ~/.cache/llm-inference-interview-bank. Registry: $npm_config_registry (as
npm itself reads it), else https://registry.npmjs.org.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import os
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

# Where the files land in the built site; mkdocs.yml's extra_css and
# extra_javascript name them by these paths.
VENDOR_DIR = "assets/vendor"
DEFAULT_REGISTRY = "https://registry.npmjs.org"
CACHE_NAME = "llm-inference-interview-bank"  # the folder under ~/.cache (CI caches it by this name)
TIMEOUT_S = 60


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    integrity: str  # the registry's dist.integrity for this version: "sha512-<base64>"
    files: tuple[str, ...]  # glob patterns inside the tarball's package/ folder

    @property
    def tarball_name(self) -> str:
        return f"{self.name}-{self.version}.tgz"

    def tarball_url(self, registry: str) -> str:
        return f"{registry.rstrip('/')}/{self.name}/-/{self.tarball_name}"


# ---------------------------------------------------------------------------
# Data: the pins. To upgrade, change version and integrity together:
#   npm view katex@<version> dist.integrity
# ---------------------------------------------------------------------------

PACKAGES = (
    # Math: renders the \( \) and \[ \] spans that pymdownx.arithmatex (generic) writes.
    Package(
        "katex", "0.16.47",
        "sha512-Eeo8Ys1doU1z+x8AZsPpQu+p/QcZBI5PeOo7QGQdy2x2m0MU/hYagBbGOmXwr5KVbEfVuWv9LpnQWeehogurjg==",
        ("LICENSE", "dist/katex.min.js", "dist/katex.min.css", "dist/fonts/*.woff2"),
    ),
    # Diagrams: Material renders ```mermaid fences with the global `mermaid` (11.x API).
    Package(
        "mermaid", "11.17.2",
        "sha512-V6K3C8EBdEsPFZXSKMJe6ppQOENxuHARr9GvHX4hh47lAbhMRD9qf4oEK7LoaRQxULMa80/qt5gHO73aCleBBg==",
        ("LICENSE", "dist/mermaid.min.js"),
    ),
)


class AssetError(PluginError):
    """A pinned asset could not be fetched, or what was fetched is not what was pinned."""


# ---------------------------------------------------------------------------
# Helper functions
# ---------------------------------------------------------------------------


def cache_dir() -> Path:
    if os.environ.get("LLM_BANK_CACHE_DIR"):
        return Path(os.environ["LLM_BANK_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / CACHE_NAME


def registry() -> str:
    return os.environ.get("npm_config_registry") or os.environ.get("NPM_CONFIG_REGISTRY") or DEFAULT_REGISTRY


def sri(data: bytes) -> str:
    """The Subresource Integrity string npm publishes: 'sha512-' + base64 of the digest."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode("ascii")


def _download(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "llm-inference-interview-bank site build"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return response.read()


def fetch_tarball(package: Package, cache: Path, registry_url: str) -> Path:
    """The package's tarball in the cache, downloaded if absent, always checked against the pin."""
    path = cache / "npm" / package.tarball_name
    if not path.is_file():
        url = package.tarball_url(registry_url)
        try:
            data = _download(url)
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise AssetError(
                f"assets: cannot download {package.name} {package.version} from {url} ({reason}). "
                f"The site build needs it once and caches it in {path.parent}. Build once with network "
                f"access, or put the tarball (`npm pack {package.name}@{package.version}`) at {path}."
            ) from None
        if sri(data) != package.integrity:
            raise AssetError(
                f"assets: {url} does not match its pinned integrity: expected {package.integrity}, "
                f"got {sri(data)}. Nothing was cached; check the registry ({registry_url}) or the pin "
                f"in docs/.hooks/assets.py."
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(path)
        return path
    actual = sri(path.read_bytes())
    if actual != package.integrity:
        raise AssetError(
            f"assets: the cached {path} does not match its pinned integrity: expected "
            f"{package.integrity}, got {actual}. Delete the file and build again."
        )
    return path


def unpack(package: Package, tarball: Path) -> dict[str, Path]:
    """The files the site needs from a checked tarball, keyed by path under the package's folder.

    Unpacked once next to the tarball; a stamp holding the integrity string marks
    a complete unpack, so an interrupted one is redone.
    """
    dest = tarball.with_suffix("")
    stamp = dest / ".integrity"
    if not (stamp.is_file() and stamp.read_text() == package.integrity):
        with tarfile.open(tarball, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith("package/")]
            for member in members:
                rel = member.name[len("package/"):]
                if ".." in rel.split("/") or not any(fnmatch.fnmatch(rel, pattern) for pattern in package.files):
                    continue
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
        stamp.write_text(package.integrity)
    found: dict[str, Path] = {}
    for pattern in package.files:
        matches = sorted(p for p in dest.rglob("*")
                         if p.is_file() and fnmatch.fnmatch(p.relative_to(dest).as_posix(), pattern))
        if not matches:
            raise AssetError(f"assets: {package.tarball_name} has no file matching '{pattern}'")
        found.update({p.relative_to(dest).as_posix(): p for p in matches})
    return found


def site_path(package: Package, rel: str) -> str:
    """Where a package file goes in the site: assets/vendor/<name>/<path without dist/>."""
    return f"{VENDOR_DIR}/{package.name}/{rel.removeprefix('dist/')}"


def vendor_files(cache: Path | None = None, registry_url: str | None = None) -> dict[str, Path]:
    """Every vendored file of the site: site path -> checked file in the cache."""
    cache = cache or cache_dir()
    registry_url = registry_url or registry()
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for rel, path in unpack(package, fetch_tarball(package, cache, registry_url)).items():
            out[site_path(package, rel)] = path
    return out


# ---------------------------------------------------------------------------
# Hooks
# ---------------------------------------------------------------------------

_state: dict[str, dict[str, Path]] = {}


def on_config(config):
    _state["files"] = vendor_files()
    wanted = [str(getattr(entry, "path", entry)) for entry in [*config.extra_css, *config.extra_javascript]]
    missing = [uri for uri in wanted if uri.startswith(VENDOR_DIR + "/") and uri not in _state["files"]]
    if missing:
        raise AssetError(f"mkdocs.yml names vendored files that docs/.hooks/assets.py does not provide: {missing}")
    return config


def on_files(files, config):
    for uri, path in _state["files"].items():
        if files.get_file_from_path(uri) is not None:
            raise AssetError(f"docs/{uri} exists: vendored files come from the npm registry, not the repository")
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
