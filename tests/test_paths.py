"""Where the lab keeps things: ``$DIFFLAB_CACHE`` and ``$DIFFLAB_CONFIG`` are honoured for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from difflab import paths
from difflab.bundle import keys


def test_difflab_config_holds_the_signing_key_and_trusted_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFLAB_CONFIG", str(tmp_path / "config"))
    assert paths.config_root() == (tmp_path / "config").resolve()
    assert keys.user_key_path().parent == keys.trusted_keys_path().parent == (tmp_path / "config").resolve()
    assert not (tmp_path / "config").exists()  # made by the key code only, with mode 0700
    key = keys.user_signing_key()
    assert key.generated and Path(key.location).parent == (tmp_path / "config").resolve()
    assert (tmp_path / "config").stat().st_mode & 0o777 == 0o700


def test_difflab_cache_is_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFLAB_CACHE", str(tmp_path / "cache"))
    assert paths.cache_root() == (tmp_path / "cache").resolve() and (tmp_path / "cache").is_dir()
