"""The README's screenshot of the TUI, `docs/images/tui.svg`, is the SVG that the snapshot test
`tests/test_tui_snapshots.py::test_coding_session[120x40]` keeps (the fake engine, fixed clocks,
120x40: a question with a file attached, the reply streaming, a message queued behind it with
the next file): so it shows the TUI as the tests see it. This copies that snapshot there.

After an intended visual change:

    .venv/bin/python -m pytest tests/test_tui_snapshots.py --snapshot-update
    .venv/bin/python -m tests.support.readme_image

`test_readme_image_is_the_snapshot` fails while the two files differ.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "__snapshots__" / "test_tui_snapshots" / "test_coding_session[120x40].svg"
IMAGE = ROOT / "docs" / "images" / "tui.svg"


def main() -> int:
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SNAPSHOT, IMAGE)
    sys.stdout.write(f"{IMAGE.relative_to(ROOT)} <- {SNAPSHOT.relative_to(ROOT)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
