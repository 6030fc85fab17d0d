"""A local package index for tests: PEP 503 pages in a folder, served over ``http.server`` on loopback.

Also builds the files it serves: tiny wheels for listing tests, and a real release's wheel
repacked under a new version with some of its code edited (a fake later release). Repacked
wheels are deterministic (sorted members, fixed timestamps, stored), so the same edit gives
the same sha256 every time.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import html
import http.server
import io
import json
import os
import re
import threading
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

FIXED_TIME = (2026, 11, 1, 0, 0, 0)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_wheel(folder: Path, name: str, version: str, tag: str = "cp311-cp311-manylinux_2_34_x86_64") -> Path:
    """A minimal valid wheel (metadata only) named ``<name>-<version>-<tag>.whl``."""
    path = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", f"# {version}\n")
        z.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{name}-{version}.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
        z.writestr(f"{name}-{version}.dist-info/RECORD", "")
    return path


def repack_release(wheel: Path, version: str, edits: Mapping[str, tuple[str, str]], folder: Path) -> Path:
    """``wheel`` (a real SGLang release) as ``version``, each ``edits[member] = (find, replace)`` applied once."""
    old = re.match(r"^sglang-([^-]+)-", wheel.name)
    assert old, wheel.name
    old_version = old[1]
    target = folder / wheel.name.replace(f"sglang-{old_version}-", f"sglang-{version}-")
    pending = dict(edits)
    members: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as src:
        for name in sorted(src.namelist()):
            data = src.read(name)
            new_name = name.replace(f"sglang-{old_version}.dist-info/", f"sglang-{version}.dist-info/")
            if name == "sglang/_version.py" or new_name.endswith(".dist-info/METADATA"):
                text = data.decode()
                text = text.replace(f"'{old_version}'", f"'{version}'")
                text = text.replace(f"Version: {old_version}\n", f"Version: {version}\n", 1)
                numbers = ", ".join(version.split("."))
                text = re.sub(r"version_tuple = \([^)]*\)", f"version_tuple = ({numbers})", text)
                data = text.encode()
            if name in pending:
                find, replace = pending.pop(name)
                text = data.decode()
                assert text.count(find) == 1, f"{name}: the edit's text is not there exactly once"
                data = text.replace(find, replace).encode()
            members[new_name] = data
    assert not pending, f"members not in the wheel: {sorted(pending)}"
    record = next(n for n in members if n.endswith(".dist-info/RECORD"))
    members[record] = _record(members, record)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as out:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.external_attr = 0o644 << 16
            out.writestr(info, data)
    return target


def _record(members: Mapping[str, bytes], record: str) -> bytes:
    """RECORD as the repacked wheel's own: every member with its sha256 and size (CSV, as a real build writes it)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for name, data in members.items():
        if name.endswith("/"):
            continue  # a directory entry: RECORD lists files only
        if name == record:
            writer.writerow([name, "", ""])
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([name, f"sha256={digest}", len(data)])
    return out.getvalue().encode()


def write_project_page(root: Path, project: str, files: list[Path], yanked: Mapping[str, str] | None = None) -> Path:
    """``root/<project>/index.html`` (PEP 503) linking ``files`` (copied beside it) with sha256 fragments."""
    folder = root / project
    folder.mkdir(parents=True, exist_ok=True)
    links = []
    for f in files:
        local = folder / f.name
        if local.resolve() != f.resolve():
            if local.exists() or local.is_symlink():
                local.unlink()
            local.symlink_to(f.resolve())
        mark = ""
        if yanked and f.name in yanked:
            mark = f' data-yanked="{html.escape(yanked[f.name])}"'
        links.append(f'<a href="{html.escape(f.name)}#sha256={sha256(f)}"{mark}>{html.escape(f.name)}</a><br>')
    page = folder / "index.html"
    page.write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    (folder / "index.json").write_text(json.dumps(_json_page(project, files, yanked or {})))
    return page


def _json_page(project: str, files: list[Path], yanked: Mapping[str, str]) -> dict[str, object]:
    return {
        "meta": {"api-version": "1.1"},
        "name": project,
        "files": [
            {
                "filename": f.name,
                "url": f.name,
                "hashes": {"sha256": sha256(f)},
                "yanked": (yanked[f.name] or True) if f.name in yanked else False,
                "upload-time": "2026-11-01T00:00:00.000000Z",
            }
            for f in files
        ],
    }


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the folder; a project URL gets PEP 691 JSON when the client prefers it, else the HTML page."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        accept = self.headers.get("Accept", "")
        path = self.translate_path(self.path)
        if self.path.endswith("/") and "application/vnd.pypi.simple.v1+json" in accept and self.server.json_pages:  # type: ignore[attr-defined]
            page = Path(path) / "index.json"
            if page.is_file():
                body = page.read_bytes()
                self.server.json_served.append(self.path)  # type: ignore[attr-defined]  # before the client can read it
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass


@contextmanager
def serve(root: Path, *, json_pages: bool = False) -> Iterator[tuple[str, list[str]]]:
    """Serve ``root`` on 127.0.0.1 (a free port); yields the base URL and the paths answered with JSON."""

    def handler(*args: object, **kwargs: object) -> _Handler:
        return _Handler(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.json_pages = json_pages  # type: ignore[attr-defined]
    server.json_served = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.json_served  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def pip_env(index_url: str) -> dict[str, str]:
    """Environment variables that make pip use only ``index_url`` (no config files, no extra locations)."""
    return {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": index_url,
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "10",
    }
