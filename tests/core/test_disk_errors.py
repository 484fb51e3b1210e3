"""oblr.disk_errors: write failures from each writing library become the OSError behind them."""

import errno

import pytest

from oblr import disk_errors


def test_writer_errors_become_the_os_error_behind_them():
    """A full disk reaches the trainer as an OSError whichever library was writing: torch's zip writer
    (RuntimeError over the OSError), safetensors' Rust writer (errno in the message), a rank's failure
    inside torch.distributed.checkpoint; other errors pass unchanged."""

    def over(inner, outer):
        try:
            try:
                raise inner
            except BaseException:
                raise outer  # noqa: B904 (the implicit context is what torch produces)
        except BaseException as e:
            return e

    zip_err = over(OSError(errno.ENOSPC, "No space left on device"), RuntimeError("unexpected pos 8576 vs 8470"))
    assert disk_errors.os_error_of(zip_err).errno == errno.ENOSPC
    rust = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert disk_errors.os_error_of(rust).errno == errno.ENOSPC

    class CheckpointException(BaseException):  # the shape of torch.distributed.checkpoint's
        failures = {1: (OSError(errno.EROFS, "Read-only file system"), "traceback")}

    assert disk_errors.os_error_of(CheckpointException()).errno == errno.EROFS
    assert disk_errors.os_error_of(RuntimeError("shape mismatch")) is None
    with pytest.raises(OSError, match="No space left") as info:
        with disk_errors.writes_as_os_errors():
            raise rust
    assert info.value.__cause__ is rust
    with pytest.raises(ValueError):
        with disk_errors.writes_as_os_errors():
            raise ValueError("not a write")
