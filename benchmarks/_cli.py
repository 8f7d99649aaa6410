"""The benchmarks' command lines: ``--help`` shows the module docstring whole.

``argparse.ArgumentParser(description=__doc__.splitlines()[0])`` cut a first sentence that
runs over two lines in the middle; :func:`parser_for` takes the docstring's first paragraph as
the description and the rest as the epilog, both printed as written
(``RawDescriptionHelpFormatter``).
"""

from __future__ import annotations

import argparse

__all__ = ["parser_for", "comparison_args"]


def parser_for(doc: str | None, **kwargs: object) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` whose description is ``doc``'s first paragraph and whose epilog
    is the rest of it (usage lines, option notes), line breaks kept."""
    text = (doc or "").strip("\n")
    first, _, rest = text.partition("\n\n")
    return argparse.ArgumentParser(description=first, epilog=rest.strip("\n") or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   **kwargs)  # type: ignore[arg-type]


def comparison_args(doc: str | None, stem: str) -> argparse.Namespace:
    """The command line of a benchmark that times a lowering change against the schedule it
    replaced (``losses.py``, ``reads_elsewhere.py``): ``--no-results``, ``--md`` (default
    ``$OUT/{stem}.md`` when ``$OUT`` is set, else None) and ``--dry-run`` (no GPU: build both
    ways and check that they differ)."""
    import os

    ap = parser_for(doc)
    ap.add_argument("--no-results", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument("--md", default=None, help=f"also write the section here (default "
                    f"$OUT/{stem}.md when $OUT is set)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: build both ways for sm_90 and check that they differ")
    args = ap.parse_args()
    if args.md is None and os.environ.get("OUT"):
        args.md = os.path.join(os.environ["OUT"], f"{stem}.md")
    return args
