"""swerl.files: a file is replaced all or nothing; a failed writer leaves the old content and no debris."""

from __future__ import annotations

import pytest

from swerl.files import atomic_path, atomic_write


def test_text_and_bytes_land_whole_and_parents_are_made(tmp_path):
    target = tmp_path / "a" / "b" / "report.json"
    atomic_write(target, "héllo\n")
    assert target.read_bytes() == "héllo\n".encode()
    atomic_write(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]


def test_the_old_content_stays_until_the_writer_finishes(tmp_path):
    target = tmp_path / "plot.png"
    target.write_text("old")
    with atomic_path(target) as tmp, atomic_path(target) as other:
        # beside the target (one filesystem: os.replace is atomic), its suffix kept (savefig reads the
        # format from it), and unique per writer
        assert tmp.parent == target.parent and tmp.suffix == ".png" and tmp != other
        tmp.write_text("new")
        other.write_text("other")
        assert target.read_text() == "old"
    assert target.read_text() == "new"  # the outer writer finished last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_a_failed_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="cut short"), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("cut short")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_the_mode_is_a_plain_writes(tmp_path):
    plain, atomic = tmp_path / "plain.txt", tmp_path / "atomic.txt"
    plain.write_text("x")
    atomic_write(atomic, "x")
    assert atomic.stat().st_mode == plain.stat().st_mode  # not mkstemp's 0600
    atomic.chmod(0o640)
    atomic_write(atomic, "y")
    assert atomic.stat().st_mode & 0o777 == 0o640  # a replaced file keeps its mode


def test_sha256_file_is_the_files_digest(tmp_path):
    (tmp_path / "abc").write_bytes(b"abc")  # FIPS 180-2's example: sha256("abc")
    from swerl.files import sha256_file

    assert sha256_file(tmp_path / "abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
