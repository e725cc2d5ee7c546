#!/usr/bin/env python3
"""Writes crates/kiln-config/tests/data/seed-option-names.txt: every option name the five seed
documents (../shared/seeds) define, per document, in document order (repeats kept).

The config test `every_option_name_of_the_seed_documents_is_known` reads that file, so the test
stands on the repository alone; run this again when the seed documents change.

    python3 scripts/seed_option_names.py [SEEDS_DIR]
"""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEEDS = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "seeds"
OUT = ROOT / "crates/kiln-config/tests/data/seed-option-names.txt"
DOCS = [
    ("000_e6bbef448403fff0.txt", "AicCompilerConfig and AicRuntimeConfig fields"),
    ("001_087bbcb7e8fe419d.txt", "QAIRT CompileConfig attributes"),
    ("002_2363c1b869467d47.txt", "HTP context / device / core / graph / group / memory configs"),
    ("003_d65661a908b58012.txt", "qaic Session keyword arguments"),
    ("004_e306b2e5cbb1ee9e.txt", "Axelera CompilerConfig properties"),
]


def names(text):
    """The option names of one seed document, read from its markup."""
    out = []
    for line in text.splitlines():
        t = line.lstrip()
        if t.startswith("- *field* "):  # pydantic: "- *field* buffer\_dealloc\_delay*: int*"
            rest = t[len("- *field* "):]
            if "*" in rest:
                out.append(rest[: rest.index("*")].replace("\\", ""))
        elif t.startswith("| `"):  # qaic keyword table: "| `dev_id` | int | ..."
            rest = t[3:]
            if "`" in rest:
                split = rest[: rest.index("`")].split()
                name = split[0] if split else ""
                if name != "model_path" and not name.startswith("**"):
                    out.append(name)
        elif t.startswith("- **`"):  # Axelera: "- **`apply_pword_padding`** *(boolean)*"
            rest = t[5:]
            if "`" in rest:
                out.append(rest[: rest.index("`")])
        elif t.startswith("- ") and "*:" in t:  # CompileConfig: "- backend\_binary\_path*: Optional[str]*"
            name = t[2 : t.index("*:")].replace("\\", "")
            if name and all(c.isascii() and (c.isalnum() or c == "_") for c in name):
                out.append(name)
    return out


def main():
    lines = [
        "# Option names defined by the seed documents (../shared/seeds), one per line, per document.",
        "# Written by scripts/seed_option_names.py; read by crates/kiln-config/tests/seeds.rs.",
    ]
    for file, what in DOCS:
        found = names((SEEDS / file).read_text(encoding="utf-8"))
        lines.append(f"[{file}] {what}: {len(found)}")
        lines.extend(found)
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
