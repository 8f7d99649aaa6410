"""The benchmarks' command lines: ``--help`` shows the module docstring whole.

``argparse.ArgumentParser(description=__doc__.splitlines()[0])`` cut a first sentence that
runs over two lines in the middle; :func:`parser_for` takes the docstring's first paragraph as
the description and the rest as the epilog, both printed as written
(``RawDescriptionHelpFormatter``).
"""

from __future__ import annotations

import argparse

__all__ = ["parser_for"]


def parser_for(doc: str | None, **kwargs: object) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` whose description is ``doc``'s first paragraph and whose epilog
    is the rest of it (usage lines, option notes), line breaks kept."""
    text = (doc or "").strip("\n")
    first, _, rest = text.partition("\n\n")
    return argparse.ArgumentParser(description=first, epilog=rest.strip("\n") or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   **kwargs)  # type: ignore[arg-type]
