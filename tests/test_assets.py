"""The pinned browser libraries (docs/.hooks/assets.py): fetched, checked, cached, never committed.

A throwaway npm registry on 127.0.0.1 serves a small tarball, so these tests
need no network: they check that a tarball is accepted only with the pinned
integrity, that a cached file that changed is refused, and that an offline
build with an empty cache stops with a message that says what to do.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import io
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")

from site_helpers import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
import assets  # noqa: E402


def _tarball(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


TARBALL = _tarball({"LICENSE": b"MIT", "dist/lib.min.js": b"window.lib = 1;", "dist/fonts/a.woff2": b"\0font",
                    "dist/fonts/a.ttf": b"\0not wanted", "src/lib.js": b"// not wanted"})
PACKAGE = assets.Package("lib", "1.2.3", assets.sri(TARBALL), ("LICENSE", "dist/lib.min.js", "dist/fonts/*.woff2"))


@pytest.fixture
def registry(tmp_path):
    """A registry on 127.0.0.1 serving lib-1.2.3.tgz at npm's tarball path."""
    root = tmp_path / "registry"
    (root / "lib" / "-").mkdir(parents=True)
    (root / "lib" / "-" / "lib-1.2.3.tgz").write_bytes(TARBALL)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("package", assets.PACKAGES, ids=lambda p: f"{p.name}@{p.version}")
def test_every_pin_is_an_exact_version_with_a_sha512_integrity(package):
    assert all(part.isdigit() for part in package.version.split(".")), f"{package.name}: pin an exact version"
    algorithm, _, digest = package.integrity.partition("-")
    assert algorithm == "sha512" and len(base64.b64decode(digest)) == 64


def test_a_tarball_with_the_pinned_integrity_is_cached_and_unpacked(tmp_path, registry):
    cache = tmp_path / "cache"
    files = assets.unpack(PACKAGE, assets.fetch_tarball(PACKAGE, cache, registry))
    assert sorted(files) == ["LICENSE", "dist/fonts/a.woff2", "dist/lib.min.js"]
    assert files["dist/lib.min.js"].read_bytes() == b"window.lib = 1;"
    assert assets.site_path(PACKAGE, "dist/lib.min.js") == "assets/vendor/lib/lib.min.js"
    # A second build uses the cache: the registry is not needed any more.
    assert assets.fetch_tarball(PACKAGE, cache, "http://127.0.0.1:9") == cache / "npm" / "lib-1.2.3.tgz"


def test_a_tarball_that_differs_from_its_pin_is_refused_and_not_cached(tmp_path, registry):
    pinned = assets.Package("lib", "1.2.3", "sha512-" + base64.b64encode(hashlib.sha512(b"other").digest()).decode(),
                            PACKAGE.files)
    with pytest.raises(assets.AssetError, match="does not match its pinned integrity"):
        assets.fetch_tarball(pinned, tmp_path / "cache", registry)
    assert not (tmp_path / "cache" / "npm" / "lib-1.2.3.tgz").exists()


def test_a_cached_tarball_that_changed_is_refused(tmp_path, registry):
    cache = tmp_path / "cache"
    path = assets.fetch_tarball(PACKAGE, cache, registry)
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(assets.AssetError, match="Delete the file and build again"):
        assets.fetch_tarball(PACKAGE, cache, registry)


def test_offline_with_an_empty_cache_says_what_to_do(tmp_path):
    with pytest.raises(assets.AssetError) as err:
        assets.fetch_tarball(PACKAGE, tmp_path / "cache", "http://127.0.0.1:9")  # nothing listens on port 9
    message = str(err.value)
    assert "cannot download lib 1.2.3" in message and "npm pack lib@1.2.3" in message
    assert str(tmp_path / "cache" / "npm" / "lib-1.2.3.tgz") in message


def test_the_repository_carries_no_vendored_library():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    vendored = [path for path in tracked
                if "/vendor/" in path or Path(path).name in ("katex.min.js", "mermaid.min.js", "katex.min.css")]
    assert not vendored, f"third-party files in the repository: {vendored}"
    assert not (ROOT / "docs" / assets.VENDOR_DIR).exists()


def test_an_asset_from_another_host_fails_the_strict_build(tmp_path):
    """Material's privacy plugin, report-only: an external image is a warning, and strict makes it fatal."""
    from site_helpers import copy_site, mkdocs_build

    project = copy_site(tmp_path / "project")
    page = "# Home\n\n![a chart](https://example.com/chart.png)\n"
    (project / "docs" / "index.md").write_text(page, encoding="utf-8")
    result = mkdocs_build(project, tmp_path / "site", strict=True)
    assert result.returncode != 0
    assert "External file: https://example.com/chart.png" in result.stderr
