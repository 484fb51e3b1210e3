"""``python -m oblr ...``: the ``oblr`` command (also ``torchrun --nproc_per_node K -m oblr train ...``)."""

from oblr.cli import _exit, main

if __name__ == "__main__":
    _exit(main())
