"""The config dataclass trees of the job modules, read from source with `ast`: the rows of the docs' key tables
(`config_rows("jobs.policy.simplify:Config")`), which `docs/hooks.py` renders into the Markdown.

Every key of a dataclass tree, dotted (list items as `N`, dict entries as `NAME`), with type, default and what it
does. The description is the field's comment (the `#` lines just above it, or a trailing one) or an attribute
docstring under it. A default that names a module constant (`PAPER_TEMPERATURE`), `list(CONSTANT)` or a module
function returning a literal shows the value, not the name.

The tree is read from source, never imported: the job modules import ray and torch at module level, and the docs
build must run without them (and fast). Names are followed through `from x import y` imports, module aliases
(`Config = ServeConfig`) and base classes, as Python's dataclass machinery would see them.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path
from typing import ClassVar, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
MAX_DEFAULT = 90  # characters of a default value shown before it is cut with "…"
WRAPPERS = {"Optional", "Annotated", "ClassVar", "Final"}


class ConfigTableError(RuntimeError):
    pass


class Row(NamedTuple):
    key: str
    type: str
    default: str
    doc: str


class Module:
    """One source file: its classes, imported names, module-level assignments and comments by line."""

    _cache: ClassVar[dict[str, Module]] = {}

    def __init__(self, name: str):
        path = ROOT / (name.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT / name.replace(".", "/") / "__init__.py"
        if not path.exists():
            raise ConfigTableError(f"config-table: no source for module {name!r}")
        self.name = name
        self.source = path.read_text(encoding="utf-8")
        self.lines = self.source.splitlines()
        tree = ast.parse(self.source, filename=str(path))
        self.classes: dict[str, ast.ClassDef] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        self.imports: dict[str, tuple[str, str]] = {}
        self.assigns: dict[str, ast.expr] = {}
        self.modules: dict[str, str] = {}  # `import x.y as z`: z -> x.y
        package = name.rsplit(".", 1)[0] if "." in name else ""
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
            elif isinstance(node, ast.ImportFrom) and node.module is not None or (
                    isinstance(node, ast.ImportFrom) and node.level):
                base = node.module or ""
                if node.level:
                    parts = package.split(".") if package else []
                    parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
                    base = ".".join([*parts, base] if base else parts)
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.modules[alias.asname] = alias.name
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.assigns[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.assigns[node.target.id] = node.value
        self.comments: dict[int, str] = {}
        for tok in tokenize.generate_tokens(io.StringIO(self.source).readline):
            if tok.type == tokenize.COMMENT:
                self.comments[tok.start[0]] = tok.string.lstrip("#").strip()

    @classmethod
    def get(cls, name: str) -> Module:
        if name not in cls._cache:
            cls._cache[name] = cls(name)
        return cls._cache[name]

    def resolve(self, name: str, depth: int = 0) -> tuple[Module, str, ast.AST] | None:
        """Where `name` (a class, or an alias of a type) is defined: (module, name, its node)."""
        if depth > 20:
            return None
        if name in self.classes:
            return self, name, self.classes[name]
        if name in self.functions:
            return self, name, self.functions[name]
        if name in self.assigns:
            value = self.assigns[name]
            if isinstance(value, ast.Name):
                return self.resolve(value.id, depth + 1)
            return self, name, value
        if name in self.imports:
            module, attr = self.imports[name]
            if not (ROOT / module.split(".")[0]).is_dir():
                return None  # a third-party or standard-library name
            try:
                return Module.get(module).resolve(attr, depth + 1)
            except ConfigTableError:
                return None
        return None

    def description(self, node: ast.AnnAssign, body: list[ast.stmt], index: int) -> str:
        """The comment block right above the field, a trailing comment, or a docstring right below it."""
        above: list[str] = []
        line = node.lineno - 1
        while line >= 1 and self.lines[line - 1].strip().startswith("#"):
            above.insert(0, self.comments.get(line, ""))
            line -= 1
        if above:
            return " ".join(above)
        for ln in range(node.lineno, (node.end_lineno or node.lineno) + 1):
            if ln in self.comments:
                return self.comments[ln]
        if index + 1 < len(body):
            nxt = body[index + 1]
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                return " ".join(nxt.value.value.split())
        return ""


def is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def unwrap(annotation: ast.expr, module: Module) -> ast.expr:
    """`Annotated[T, ...]`, `Optional[T]`, `T | None` and aliases of `Annotated[T, ...]` -> T."""
    while True:
        if isinstance(annotation, ast.Subscript) and _name(annotation.value) in WRAPPERS:
            inner = annotation.slice
            annotation = inner.elts[0] if isinstance(inner, ast.Tuple) else inner
        elif isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
            if _is_none(annotation.right):
                annotation = annotation.left
            elif _is_none(annotation.left):
                annotation = annotation.right
            else:
                return annotation
        elif isinstance(annotation, ast.Name) and (found := module.resolve(annotation.id)) and \
                isinstance(found[2], ast.Subscript) and _name(found[2].value) == "Annotated":
            annotation = found[2]
            module = found[0]
        else:
            return annotation


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def dataclass_of(annotation: ast.expr, module: Module) -> tuple[Module, ast.ClassDef] | None:
    if isinstance(annotation, ast.Attribute) and isinstance(annotation.value, ast.Name):
        # `md.Protocol` after `import eval.judging.menlo_data as md` or `from eval import menlo_data as md`
        alias = annotation.value.id
        target = module.modules.get(alias) or ".".join(module.imports.get(alias, ("", ""))).strip(".")
        try:
            found = Module.get(target).resolve(annotation.attr) if target else None
        except ConfigTableError:
            return None
    elif isinstance(annotation, ast.Name):
        found = module.resolve(annotation.id)
    else:
        return None
    if found and isinstance(found[2], ast.ClassDef) and is_dataclass(found[2]):
        return found[0], found[2]
    return None


def type_text(annotation: ast.expr, module: Module) -> str:
    annotation = _Values(module, depth=5).visit(_copy(unwrap(annotation, module)))  # `md.Protocol` -> `Protocol`
    return ast.unparse(annotation).replace(" | ", " or ")


class _Values(ast.NodeTransformer):
    """Module constants in a default expression replaced by their literal values (as far as they are literals)."""

    def __init__(self, module: Module, depth: int = 0):
        self.module, self.depth = module, depth

    def visit_Name(self, node: ast.Name) -> ast.AST:
        found = self.module.resolve(node.id) if self.depth < 5 else None
        if found and not isinstance(found[2], (ast.ClassDef, ast.FunctionDef)) and _is_literal(found[2], found[0]):
            return _Values(found[0], self.depth + 1).visit(_copy(found[2]))
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        name = _name(node.func)
        if name in ("list", "tuple", "sorted") and len(node.args) == 1 and not node.keywords:
            try:
                value = ast.literal_eval(node.args[0])
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return node
            items = list(value) if name != "sorted" else sorted(value)
            return ast.parse(repr(items if name != "tuple" else tuple(items)), mode="eval").body
        if isinstance(node.func, ast.Name) and not node.args and not node.keywords:
            found = self.module.resolve(node.func.id)
            body = found[2].body if found and isinstance(found[2], ast.FunctionDef) else []
            if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
                return _Values(found[0], self.depth + 1).visit(_copy(body[0].value))
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and (node.value.id in self.module.modules or
                                                 node.value.id in self.module.imports):
            return ast.Name(id=node.attr, ctx=ast.Load())  # `md.Protocol(...)` reads `Protocol(...)`
        return node


def _copy(node: ast.AST) -> ast.AST:
    return ast.parse(ast.unparse(node), mode="eval").body


def _is_literal(node: ast.AST, module: Module) -> bool:
    try:
        ast.literal_eval(_Values(module, 4).visit(_copy(node)))
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _value_text(node: ast.expr, module: Module | None) -> str:
    if module is not None:
        node = _Values(module).visit(_copy(node))
    text = ast.unparse(node)
    return text if len(text) <= MAX_DEFAULT else text[:MAX_DEFAULT - 1].rstrip() + "…"


def default_text(value: ast.expr | None, module: Module | None = None) -> str:
    if value is None:
        return "required"
    if isinstance(value, ast.Call) and _name(value.func) == "field":
        for kw in value.keywords:
            if kw.arg == "default":
                return _value_text(kw.value, module)
            if kw.arg == "default_factory":
                factory = kw.value
                if isinstance(factory, ast.Lambda):
                    return _value_text(factory.body, module)
                if isinstance(factory, ast.Name) and factory.id in ("list", "dict", "tuple", "set"):
                    return {"list": "[]", "dict": "{}", "tuple": "()", "set": "set()"}[factory.id]
                return _value_text(ast.Call(func=factory, args=[], keywords=[]), module)
        return "required"
    return _value_text(value, module)


def fields(module: Module, cls: ast.ClassDef, seen: tuple[str, ...] = ()) -> list[tuple[Module, ast.AnnAssign, str]]:
    """The dataclass fields in Python's order: bases first, a redefined field keeping its first place."""
    ordered: dict[str, tuple[Module, ast.AnnAssign, str]] = {}
    for base in cls.bases:
        found = module.resolve(_name(base)) if _name(base) else None
        if found and isinstance(found[2], ast.ClassDef) and f"{found[0].name}.{found[1]}" not in seen:
            for item in fields(found[0], found[2], (*seen, f"{found[0].name}.{found[1]}")):
                ordered[item[1].target.id] = item
    for index, node in enumerate(cls.body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(node.annotation, ast.Subscript) and _name(node.annotation.value) == "ClassVar":
                continue
            ordered[node.target.id] = (module, node, module.description(node, cls.body, index))
    return list(ordered.values())


def rows(module: Module, cls: ast.ClassDef, prefix: str = "", stack: tuple[str, ...] = ()) -> list[Row]:
    out: list[Row] = []
    for owner, node, doc in fields(module, cls):
        key = prefix + node.target.id
        annotation = unwrap(node.annotation, owner)
        nested = dataclass_of(annotation, owner)
        item_prefix = None
        if nested is None and isinstance(annotation, ast.Subscript) and _name(annotation.value) in ("list", "dict"):
            args = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
            nested = dataclass_of(unwrap(args[-1], owner), owner)
            item_prefix = f"{key}.{'N' if _name(annotation.value) == 'list' else 'NAME'}."
        ident = f"{nested[0].name}.{nested[1].name}" if nested else ""
        if nested and ident not in stack:
            section_doc = doc or (ast.get_docstring(nested[1]) or "").split("\n\n")[0]
            if item_prefix is None:
                out.append(Row(key, "section", "", " ".join(section_doc.split())))
                out.extend(rows(nested[0], nested[1], key + ".", (*stack, ident)))
            else:
                out.append(Row(key, type_text(node.annotation, owner), default_text(node.value, owner),
                               " ".join(section_doc.split())))
                out.extend(rows(nested[0], nested[1], item_prefix, (*stack, ident)))
        else:
            out.append(Row(key, type_text(node.annotation, owner), default_text(node.value, owner), doc))
    return out


def config_rows(target: str) -> list[Row]:
    """The rows of `module:Class` (e.g. `jobs.policy.simplify:Config`)."""
    module_name, _, class_name = target.partition(":")
    found = Module.get(module_name).resolve(class_name)
    if not found or not isinstance(found[2], ast.ClassDef) or not is_dataclass(found[2]):
        raise ConfigTableError(f"config-table: {target} is not a dataclass found in the source")
    return rows(found[0], found[2])
