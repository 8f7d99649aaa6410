"""``python -m kernelpack``: the ``kernelpack`` command (see :mod:`kernelpack.cli`)."""

from .cli import main

raise SystemExit(main())
