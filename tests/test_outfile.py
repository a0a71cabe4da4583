"""`-o`: atomic replace only for regular files and new paths; special files are written into, never
replaced; symlinks followed; hard links kept; modes kept (umask defaults for new files).

Nothing here touches the real /dev: FIFOs are made with os.mkfifo, a character device is a regular
file that a mocked os.stat reports as one, and a full disk is a mocked write."""

from __future__ import annotations

import errno
import io
import os
import stat
import threading

import numpy as np
import pytest

import spmdlang
from spmdlang import outfile
from spmdlang.cli import main

PROG = """mesh [x=2]
func main(a: f32[4] {x}) -> f32[4] {
  return a * 2.0
}
"""


@pytest.fixture
def prog(tmp_path):
    p = tmp_path / "prog.spmd"
    p.write_text(PROG)
    return str(p)


def ir_text(prog):
    return spmdlang.compile(prog).ir


def compile_to(capsys, prog, dest) -> tuple[int, str, str]:
    code = main(["compile", prog, "--target", "ir", "-o", str(dest)])
    out, err = capsys.readouterr()
    return code, out, err


def test_new_file_gets_umask_defaults(capsys, prog, tmp_path):
    dest = tmp_path / "new.ir"
    old = os.umask(0o027)
    try:
        code, _, err = compile_to(capsys, prog, dest)
    finally:
        os.umask(old)
    assert code == 0, err
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640
    assert dest.read_text() == ir_text(prog)


def test_existing_file_keeps_its_mode_and_is_replaced_atomically(capsys, prog, tmp_path):
    dest = tmp_path / "old.ir"
    dest.write_text("old contents")
    dest.chmod(0o751)
    code, _, err = compile_to(capsys, prog, dest)
    assert code == 0, err
    assert stat.S_IMODE(dest.stat().st_mode) == 0o751
    assert dest.read_text() == ir_text(prog)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".spmdlang-")] == []


def test_symlink_is_followed_and_kept(capsys, prog, tmp_path):
    target = tmp_path / "target.ir"
    target.write_text("old")
    target.chmod(0o644)
    link = tmp_path / "link.ir"
    link.symlink_to(target)
    code, _, err = compile_to(capsys, prog, link)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == ir_text(prog)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_dangling_symlink_creates_its_target(capsys, prog, tmp_path):
    link = tmp_path / "link.ir"
    link.symlink_to(tmp_path / "made.ir")
    code, _, err = compile_to(capsys, prog, link)
    assert code == 0, err
    assert link.is_symlink() and (tmp_path / "made.ir").read_text() == ir_text(prog)


def test_hard_link_is_written_in_place(capsys, prog, tmp_path):
    """A file with other hard links is rewritten in place, so every name sees the new contents
    (a rename would leave the other names on the old file)."""
    a, b = tmp_path / "a.ir", tmp_path / "b.ir"
    a.write_text("old contents, longer than nothing" * 100)
    os.link(a, b)
    inode = a.stat().st_ino
    code, _, err = compile_to(capsys, prog, a)
    assert code == 0, err
    assert a.stat().st_ino == inode and b.stat().st_ino == inode and a.stat().st_nlink == 2
    assert b.read_text() == ir_text(prog)  # truncated, not just overwritten at the front


def test_fifo_is_written_into_not_replaced(capsys, prog, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    code, _, err = compile_to(capsys, prog, fifo)
    reader.join(30)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert got == [ir_text(prog).encode()]


def test_character_device_is_written_into_not_replaced(capsys, prog, tmp_path, monkeypatch):
    """A regular file that os.stat reports as a character device: written in place (same inode,
    no rename), as /dev/null or a terminal would be."""
    dev = tmp_path / "fake-null"
    dev.write_text("")
    inode = dev.stat().st_ino
    real_stat = os.stat

    def fake_stat(path, *a, **kw):
        st = real_stat(path, *a, **kw)
        if os.fspath(path) == str(dev):
            fields = list(st)
            fields[0] = stat.S_IFCHR | 0o666
            return os.stat_result(fields)
        return st

    replaced = []
    monkeypatch.setattr(outfile.os, "stat", fake_stat)
    monkeypatch.setattr(outfile.os, "replace", lambda *a: replaced.append(a))
    code, _, err = compile_to(capsys, prog, dev)
    assert code == 0, err
    assert replaced == [] and real_stat(dev).st_ino == inode
    assert dev.read_text() == ir_text(prog)


def test_dash_is_stdout(capsys, prog):
    code, out, err = compile_to(capsys, prog, "-")
    assert code == 0 and out == ir_text(prog)


def test_run_dash_writes_npz_to_stdout_and_the_summary_to_stderr(prog, monkeypatch):
    buf = io.BytesIO()

    class Out(io.TextIOWrapper):
        pass

    out = Out(buf, encoding="utf-8")
    monkeypatch.setattr("sys.stdout", out)
    code = main(["run", prog, "--backend", "ref", "-o", "-"])
    out.flush()
    assert code == 0
    data = np.load(io.BytesIO(buf.getvalue()))
    np.testing.assert_allclose(data["out0"], spmdlang.compile(prog).run(backend="ref")[0])


@pytest.mark.parametrize("kind", ["socket", "dir"])
def test_other_special_files_are_refused(capsys, prog, tmp_path, kind):
    if kind == "dir":
        path = tmp_path / "d"
        path.mkdir()
    else:
        import socket

        path = tmp_path / "s"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    code, _, err = compile_to(capsys, prog, path)
    assert code == 2 and "cannot write" in err and "internal error" not in err


def test_full_disk_on_a_file_is_an_io_error(capsys, prog, tmp_path, monkeypatch):
    dest = tmp_path / "out.ir"
    dest.write_text("keep me")

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    dev_stat = os.stat
    monkeypatch.setattr(outfile.os, "stat", lambda p, *a, **k: os.stat_result(
        [stat.S_IFCHR | 0o666] + list(dev_stat(p, *a, **k))[1:]))
    monkeypatch.setattr(outfile.os, "write", full)
    code, _, err = compile_to(capsys, prog, dest)
    assert code == 1 and "No space left on device" in err and "internal error" not in err


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc/self/fd")
def test_proc_fd_link_to_a_pipe_is_written_into(capsys, prog):
    """What `-o /dev/stdout` resolves to when stdout is a pipe: a /proc magic link, written through."""
    r, w = os.pipe()
    try:
        code, _, err = compile_to(capsys, prog, f"/proc/self/fd/{w}")
        assert code == 0, err
        os.close(w)
        w = None
        with os.fdopen(r, "rb") as f:
            r = None
            assert f.read() == ir_text(prog).encode()
    finally:
        for fd in (r, w):
            if fd is not None:
                os.close(fd)


def test_full_disk_during_an_atomic_replace_keeps_the_old_file(capsys, prog, tmp_path, monkeypatch):
    dest = tmp_path / "out.ir"
    dest.write_text("keep me")
    real_fdopen = os.fdopen

    class Full(io.BufferedWriter):
        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(outfile.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode, buffering=0)))
    code, _, err = compile_to(capsys, prog, dest)
    assert code == 1 and "No space left on device" in err
    assert dest.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.ir", "prog.spmd"]  # no temp file left


@pytest.mark.parametrize("command", [["compile", "--target", "ir"], ["run", "--backend", "ref"],
                                     ["autoshard"]])
def test_an_empty_output_path_is_command_line_misuse(prog, capsys, command):
    """Only `-` means standard output: `-o ""` (an unset shell variable) is refused with exit 2
    and writes nothing (it printed to stdout, exit 0)."""
    with pytest.raises(SystemExit) as e:
        main([command[0], prog, *command[1:], "-o", ""])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and "-o: the path is empty" in err
