"""Writing `-o` outputs without harming what the path already is.

- `-` is standard output.
- A symbolic link is followed: its target is written, the link stays.
- A regular file (or a path that does not exist yet) is replaced atomically: a temporary file in the
  same directory, renamed over it. The old file's permission bits are kept; a new file gets the
  umask's defaults (0666 & ~umask), as a shell redirection would.
- A regular file with other hard links is written in place (truncated and rewritten), so every
  name keeps seeing the same file; that write is not atomic.
- Character devices (/dev/null, a terminal) and FIFOs are written straight into, never replaced.
- Directories, block devices and sockets are refused.

Bad paths are `OutputPathError` (the command line is wrong: exit 2); a failing write (a full disk,
a closed pipe) is `OutputWriteError` (exit 1).
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile


class OutputPathError(Exception):
    """The output path cannot be written to at all (command-line misuse)."""


class OutputWriteError(Exception):
    """Writing the output failed part way (I/O error)."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_output(path: str, data: bytes) -> None:
    """Write `data` to `path` as described in the module docstring."""
    if path == "-":
        write_stdout(data)
        return
    try:
        st = os.stat(path)  # follows symlinks, /dev/stdout's /proc magic link included
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputPathError(f"cannot write '{path}': {e.strerror or e}") from None
    if st is None:
        real = os.path.realpath(path)  # a dangling symlink: its target is created
        if not os.path.isdir(os.path.dirname(real)):
            parent = os.path.dirname(os.path.abspath(path))
            raise OutputPathError(f"cannot write '{path}': no such directory '{parent}'")
        _replace(path, real, data, 0o666 & ~_umask(), None)
    elif stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"cannot write '{path}': it is a directory")
    elif stat.S_ISREG(st.st_mode):
        real = os.path.realpath(path)
        try:
            same = os.path.samestat(os.stat(real), st)
        except OSError:
            same = False
        if st.st_nlink > 1 or not same:  # other names for it, or no name to rename onto (/dev/stdout)
            _write_in_place(path, path, data, truncate=True)
        else:
            _replace(path, real, data, stat.S_IMODE(st.st_mode), st)
    elif stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        _write_in_place(path, path, data, truncate=False)
    else:
        kind = "a block device" if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) \
            else "not a regular file"
        raise OutputPathError(f"cannot write '{path}': it is {kind}")


def write_stdout(data: bytes) -> None:
    try:
        sys.stdout.flush()
        out = getattr(sys.stdout, "buffer", None)
        if out is None:
            sys.stdout.write(data.decode("utf-8", "replace"))
        else:
            out.write(data)
        sys.stdout.flush()
    except OSError as e:
        raise OutputWriteError(f"cannot write to standard output: {e.strerror or e}") from None


def _write_in_place(path: str, real: str, data: bytes, truncate: bool) -> None:
    flags = os.O_WRONLY | (os.O_TRUNC if truncate else 0)
    try:
        fd = os.open(real, flags)
    except OSError as e:
        raise OutputPathError(f"cannot write '{path}': {e.strerror or e}") from None
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError as e:
        raise OutputWriteError(f"cannot write '{path}': {e.strerror or e}") from None
    finally:
        os.close(fd)


def _replace(path: str, real: str, data: bytes, mode: int, old) -> None:
    directory = os.path.dirname(real)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".spmdlang-")
    except OSError as e:
        raise OutputPathError(f"cannot write '{path}': {e.strerror or e}") from None
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fchmod(f.fileno(), mode)
                if old is not None and (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
                    try:  # keep the owner where we may (as root); otherwise the writer owns it
                        os.fchown(f.fileno(), old.st_uid, old.st_gid)
                    except OSError:
                        pass
            os.replace(tmp, real)
        except OSError as e:
            raise OutputWriteError(f"cannot write '{path}': {e.strerror or e}") from None
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
