"""Atomic result files: readable by others like a plain open() would make them."""
import os

import pytest

from replication.core import files


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_results_are_written_with_the_umask_like_open(tmp_path, umask, mode):
    """Atomic writes give a result the mode a plain open() would: 0644 under the usual umask 022."""
    old = os.umask(umask)
    try:
        paths = [files.write_json(tmp_path / "a.json", {"x": 1}), files.write_text(tmp_path / "b.md", "b")]
        with open(tmp_path / "plain", "w"):
            pass
    finally:
        os.umask(old)
    assert [p.stat().st_mode & 0o777 for p in paths] == [mode, mode] == [(tmp_path / "plain").stat().st_mode & 0o777] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.md", "plain"]  # no temporary file left
