"""A griffe extension for the API reference: the package's lazily imported public names, and no
undocumented instance attributes.

``streaming_merge`` and ``streaming_merge.cdf`` import their public names on first use
(PEP 562 ``__getattr__``), reading where each lives from a literal ``_HOMES`` dict. Static
analysis sees no import there, so this extension reads that dict and adds each name as an alias
of its home: mkdocstrings then documents ``streaming_merge.MergeSink`` under its public name,
wherever the class moves.

Attributes a class sets in ``__init__`` without a docstring (``self._spark``, ``self.path``) are
state, not API: they are left out of the reference.
"""

from __future__ import annotations

import ast
from typing import Any

import griffe


class LazyExports(griffe.Extension):
    def on_module_members(self, *, node: ast.AST | griffe.ObjectNode, mod: griffe.Module, **kwargs: Any) -> None:
        if not isinstance(node, ast.Module):
            return
        for statement in node.body:
            if not (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Dict)
                    and any(isinstance(t, ast.Name) and t.id == "_HOMES" for t in statement.targets)):
                continue
            for key, value in zip(statement.value.keys, statement.value.values, strict=True):
                if not (isinstance(key, ast.Constant) and isinstance(value, ast.Constant)):
                    continue
                name, home = key.value, value.value
                if name in mod.members and not mod.members[name].is_alias:
                    continue
                mod.set_member(name, griffe.Alias(name, f"{home}.{name}", parent=mod, lineno=statement.lineno))

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        for name, member in list(cls.members.items()):
            if (not member.is_alias and member.is_attribute and "instance-attribute" in member.labels
                    and not member.docstring):
                cls.del_member(name)
