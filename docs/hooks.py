"""mkdocs hooks: the reference tables, generated from the code at every build.

A page holding ``<!-- reference:NAME -->`` gets ``gen_reference.render(NAME)`` in its place
(see docs/gen_reference.py for the names). A marker with an unknown name fails the build.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import gen_reference

log = logging.getLogger("mkdocs.hooks.reference")

_MARKER = re.compile(r"<!--\s*reference:([\w.:-]+)\s*-->")


def on_pre_build(config: Any, **kwargs: Any) -> None:
    for name in gen_reference.stale_texts():
        log.info("docs/gen_reference.py has text for %s, which the code no longer has", name)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    return _MARKER.sub(lambda m: gen_reference.render(m.group(1)), markdown)
