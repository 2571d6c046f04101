"""trainer/storage.py against local paths, memory:// and a real GCS emulator."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import storage


def test_is_remote_and_local_path() -> None:
    assert storage.is_remote("gs://b/x") and storage.is_remote("memory://x")
    assert not storage.is_remote("/tmp/x") and not storage.is_remote("rel/x")
    assert not storage.is_remote("file:///tmp/x")
    assert storage.local_path("file:///tmp/x") == "/tmp/x"
    assert storage.join("gs://b/", "/a/", "c") == "gs://b/a/c"
    assert (
        storage.normalize("file:///tmp/x") == "/tmp/x"
        and storage.normalize("gs://b/x") == "gs://b/x"
    )
    with pytest.raises(ValueError):
        storage.local_path("gs://b/x")


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != storage.COMPLETE
    }


def _make_dir(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}')
    (root / "model.safetensors").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    (root / "sub" / "tokenizer.json").write_text("{}")
    return root


@pytest.fixture(params=["local", "gcs"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A writable root: a local dir, or a fresh bucket on the emulator."""
    if request.param == "local":
        return str(tmp_path / "store")
    emulator = request.getfixturevalue("gcs_emulator")
    name = f"storage-{request.node.name.split('[')[0].replace('_', '-')[-40:]}".strip("-")
    return emulator.create_bucket(name)


def test_upload_list_open_copy_remove(base: str, tmp_path: Path) -> None:
    src = _make_dir(tmp_path / "src")
    uri = storage.join(base, "models/m1")
    storage.upload_dir(src, uri)
    assert storage.exists(uri) and storage.isdir(uri)
    assert storage.listdir(uri) == sorted(
        storage.join(uri, n) for n in ("config.json", "model.safetensors", "sub")
    )
    assert storage.glob(storage.join(uri, "*.json")) == [storage.join(uri, "config.json")]
    assert storage.read_text(storage.join(uri, "config.json")) == '{"a": 1}'
    storage.write_text(storage.join(base, "deep/er/note.txt"), "hi")
    assert storage.read_text(storage.join(base, "deep/er/note.txt")) == "hi"

    copied = storage.copy_to_local(uri, tmp_path / "copy")
    assert _tree(copied) == _tree(src)
    light = storage.copy_to_local(uri, tmp_path / "light", skip_suffixes=(".safetensors",))
    assert sorted(_tree(light)) == ["config.json", "sub/tokenizer.json"]

    # upload_dir replaces: a file that is gone locally is gone remotely.
    (src / "config.json").unlink()
    storage.upload_dir(src, uri)
    assert not storage.exists(storage.join(uri, "config.json"))
    storage.remove(uri)
    assert not storage.exists(uri) and storage.listdir(uri) == []
    storage.remove(uri)  # removing what is gone is fine


def test_missing_paths_and_buckets_name_the_uri_and_the_fix(base: str) -> None:
    missing = storage.join(base, "nope/config.json")
    with pytest.raises(FileNotFoundError, match=r"nope/config\.json does not exist"):
        storage.read_text(missing)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        storage.copy_to_local(storage.join(base, "nope"), "/tmp/unused-llmft-copy")


def test_missing_bucket_says_create_it(gcs_emulator) -> None:
    with pytest.raises(storage.StorageNotFound, match=r"bucket 'no-such-bucket' .*create it"):
        storage.read_text("gs://no-such-bucket/x.json")


def test_permission_denied_says_which_role() -> None:
    err = storage.explain("gs://b/x", OSError("Forbidden: b/x\nno access"), "write")
    assert isinstance(err, PermissionError)
    assert "no permission to write gs://b/x" in str(err)
    assert "roles/storage.objectAdmin" in str(err)
    assert storage.explain("gs://b/x", RuntimeError("other")) is None


_CACHE_WORKER = """
import sys
from trainer import storage
print(storage.cached_copy(sys.argv[1]))
"""


def test_cached_copy_downloads_once_per_node(gcs_emulator, tmp_path: Path) -> None:
    """Four processes ask at once (as four ranks of a node do): one download, one copy."""
    bucket = gcs_emulator.create_bucket("cache-test")
    src = _make_dir(tmp_path / "src")
    uri = f"{bucket}/model"
    storage.upload_dir(src, uri)
    env = {
        **os.environ,
        storage.CACHE_ENV: str(tmp_path / "cache"),
        "PYTHONPATH": str(Path(__file__).parents[1]),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CACHE_WORKER, uri], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert len(set(outs)) == 1
    local = Path(outs[0])
    assert _tree(local) == _tree(src)
    assert (local / storage.COMPLETE).read_text().strip() == uri
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert entries == sorted([local.name, f"{local.name}.lock"])  # no partial left behind
    assert storage.cached_copy(str(src)) == str(src)  # local paths are used in place
