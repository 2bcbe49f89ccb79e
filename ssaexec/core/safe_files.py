"""Files written atomically and opened only when they are regular files.

Every file ssaexec writes that a crash must not leave half written (checkpoints, trained
parameters, Paddle's ``.pdiparams``) and every file it reads from a folder others may
write into (a checkpoint folder) goes through here, so the policy is decided once.

Policy:

* **Atomic write** (``atomic_write``): the data goes to a new temporary file in the
  target's own folder (``mkstemp``: created, never opened through an existing name),
  is flushed to disk, and renamed over the target; then the folder is flushed, so the
  rename survives a power cut. A crash leaves the old file or the new one, never half
  of one. The rename *replaces* a symlink at the target, never writes through it: what
  a symlink points at is never touched. A FIFO, socket or device at the target is
  refused (``NotRegularFile``), never replaced. On any failure the temporary file is
  removed and the target is unchanged.
* **Regular files only** (``open_regular``, ``read_regular``; every file a user names
  to be read: programs, startup and parameter files, traces, feeds): a read opens the name with ``O_NONBLOCK``
  (opening a FIFO for reading would otherwise wait for a writer forever) and, where
  asked, ``O_NOFOLLOW``; then ``fstat`` on the open descriptor (not on the name, which
  could change in between) refuses anything that is not a regular file: FIFOs, sockets,
  devices, folders. Reading a regular file never blocks on its opener.
"""

import os
import stat
import tempfile

__all__ = ["atomic_write", "fsync_folder", "open_regular", "read_regular", "open_input", "read_input", "fd_path", "replace_problem",
           "NotRegularFile"]


class NotRegularFile(OSError):
    """The name is not a regular file (a FIFO, socket, device, folder, or a symlink
    where symlinks are not followed); ``kind`` says which."""

    def __init__(self, path, kind):
        super().__init__(f"{path}: is {kind}, not a regular file")
        self.path, self.kind = path, kind


def _kind(mode):
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return what
    return "not a regular file"


def open_regular(path, follow_symlinks=True):
    """Open ``path`` for reading when it is a regular file; return the descriptor.

    Never blocks (``O_NONBLOCK``). Raises ``NotRegularFile`` for anything else (with
    ``follow_symlinks=False``, also for a symlink), and the usual ``OSError``s
    (``FileNotFoundError``, ``PermissionError``). The caller closes the descriptor.
    """
    path = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        # O_NOFOLLOW on a symlink: ELOOP; name it as what it is
        if not follow_symlinks and os.path.islink(path):
            raise NotRegularFile(path, "a symlink") from None
        if isinstance(e, IsADirectoryError):
            raise NotRegularFile(path, "a directory") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, _kind(mode))
        # the descriptor stays non-blocking: that changes nothing for a regular file
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path):
    """The bytes of ``path`` when it is a regular file (``open_regular``, symlinks
    followed): a FIFO is ``NotRegularFile``, never waited on (``ssaexec dump FIFO`` hung),
    and a device is never read without end (``/dev/zero`` as a program file)."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read()


def open_input(path, noun, kind, error, follow_symlinks=True):
    """``open_regular(path)``, its failures as ``error`` naming ``path``: a descriptor.

    ``noun`` names what is missing or unreadable ("feed file"), ``kind`` what anything
    but a regular file is not ("an .npz feed file"); ``error`` is the caller's error class.
    """
    try:
        return open_regular(path, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        raise error(f"{path}: no such {noun}") from None
    except NotRegularFile as e:
        raise error(f"{path}: is {e.kind}, not {kind}") from None
    except OSError as e:
        raise error(f"{path}: cannot read the {noun}: {e.strerror or e}") from None


def read_input(path, noun, kind, error):
    """The bytes of ``path`` (``open_input``'s checks and errors; symlinks followed)."""
    with os.fdopen(open_input(path, noun, kind, error), "rb") as f:
        return f.read()


def fd_path(fd, path):
    """A name that opens the very file ``fd`` is open on (``/proc/self/fd/N`` where the
    system has it, else ``path``): for libraries that take a name, not a descriptor, so
    the name cannot be swapped for a FIFO or a symlink between the check and the read."""
    proc = f"/proc/self/fd/{fd}"
    return proc if os.path.exists(proc) else os.fspath(path)


def _default_mode():
    # the mode a plain open() would give a new file: 0o666 less the umask (read once,
    # at import, before any thread of ours can race the set-and-restore)
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


_MODE = _default_mode()


def atomic_write(path, write, prefix=".tmp-", before_rename=None, private=False):
    """Write ``path`` atomically (the policy above); return ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        The target. A symlink there is replaced, not followed; a folder there is an
        ``IsADirectoryError``, a FIFO, socket or device ``NotRegularFile`` (nothing
        written).
    write : callable
        ``write(tmp)`` writes the whole content to the temporary file named ``tmp``.
    prefix : str
        Name prefix of the temporary file (``.ckpt-`` for checkpoints, which
        ``Checkpoints.resume`` recognises as a dead save).
    before_rename : callable, optional
        Called after the data is on disk, before the rename (a fault-injection point).
    private : bool
        Keep the temporary file's owner-only mode (``0o600``) for the target; otherwise
        the target gets the mode a plain ``open`` would give it (``0o666`` less the umask).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) and not os.path.islink(path):
        raise IsADirectoryError(21, "Is a directory", path)
    problem = replace_problem(path)
    if problem is not None:
        raise NotRegularFile(path, problem)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW)
        try:
            if not private:
                os.fchmod(fd, _MODE)
            os.fsync(fd)
        finally:
            os.close(fd)
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
        fsync_folder(folder)
    except BaseException:
        try:
            os.unlink(tmp)  # our own file (or whatever replaced it: unlink never follows)
        except FileNotFoundError:
            pass
        raise
    return path


def replace_problem(path):
    """What ``atomic_write`` would wrongly replace at ``path`` (``"a FIFO (named pipe)"``,
    ``"a character device"`` ...), or None for nothing there, a regular file or a symlink.

    The rename would put a regular file in place of a FIFO, socket or device node: as
    root, ``--save /dev/null`` replaced the system's ``/dev/null`` with a file. A folder
    is ``IsADirectoryError``'s (``atomic_write``)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode):
        return None
    return _kind(mode)


def fsync_folder(folder):
    # the rename is an entry of the folder: until the folder is flushed, a power cut may
    # keep the old entry (POSIX; some filesystems cannot open a folder, and need not)
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
