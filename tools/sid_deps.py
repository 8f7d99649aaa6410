"""The .deb files a set of Debian packages needs, from a Packages index (tools/sid-python.sh).

    python3 tools/sid_deps.py PACKAGES_FILE ROOT[,ROOT...] [SKIP[,SKIP...]]

Prints ``name version pool/path.deb`` for each root and everything its Depends/Pre-Depends
reach, amd64 or arch-all, an alternative's first name that the index holds, a virtual name
through the first package providing it; names in SKIP (and what only they reach) are left
out. A name the index lacks is reported on stderr and skipped.
"""

from __future__ import annotations

import re
import sys


def read_index(path: str) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Packages by name (the first stanza of each), and virtual names to a provider."""
    packages: dict[str, dict[str, str]] = {}
    provides: dict[str, str] = {}
    stanza: dict[str, str] = {}

    def keep() -> None:
        if stanza.get("Package") and stanza.get("Architecture") in ("amd64", "all"):
            packages.setdefault(stanza["Package"], dict(stanza))
            for item in stanza.get("Provides", "").split(","):
                name = item.strip().split(" ")[0]
                if name:
                    provides.setdefault(name, stanza["Package"])

    with open(path, encoding="utf-8", errors="replace") as index:
        for line in index:
            if line == "\n":
                keep()
                stanza = {}
            elif not line[0].isspace() and ":" in line:
                key, value = line.split(":", 1)
                stanza[key] = value.strip()
    keep()
    return packages, provides


def closure(packages: dict[str, dict[str, str]], provides: dict[str, str], roots: list[str],
            skip: set[str]) -> list[str]:
    """The roots and their dependencies, breadth first."""
    seen: list[str] = []
    todo = list(roots)
    while todo:
        name = todo.pop(0)
        if name not in packages and name in provides:
            name = provides[name]
        if name in seen or name in skip:
            continue
        if name not in packages:
            print(f"missing from the index: {name}", file=sys.stderr)
            continue
        seen.append(name)
        for field in ("Pre-Depends", "Depends"):
            choices = (x.strip() for x in packages[name].get(field, "").split(","))
            for choice in filter(None, choices):
                names = [re.split(r"[ (:]", alt.strip())[0] for alt in choice.split("|")]
                todo.append(next((n for n in names if n in packages), names[0]))
    return seen


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    packages, provides = read_index(sys.argv[1])
    skip = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else set()
    for name in closure(packages, provides, sys.argv[2].split(","), skip):
        print(name, packages[name]["Version"], packages[name]["Filename"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
