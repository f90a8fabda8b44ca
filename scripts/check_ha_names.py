"""Check that every Home Assistant name the component uses exists in the newest HA.

The tests run on Home Assistant 2025.4.4 (the newest release installable on Python
3.13); the component must also work on the current release, which needs a newer
Python than these machines have. This script closes part of that gap without
installing anything: it downloads the newest ``homeassistant`` wheel from PyPI,
opens it as a zip file and checks, by parsing source with ``ast``, that

- every ``homeassistant.*`` module the component imports exists,
- every name imported with ``from homeassistant.x import a, b`` is defined at module
  level in that module (assignment, def, class, import/re-export, ``__all__``, or
  one level of ``from .y import *``) or is a submodule of it,
- every attribute used on an imported HA module (``conversation.ChatLog``,
  ``dr.DeviceInfo``, ``homeassistant.helpers.llm.Tool`` …) exists the same way.

Names the component imports inside version guards (a ``try`` whose ``except``
catches ``ImportError``) or on a line marked ``# compat: optional`` may be missing:
they are listed, not counted as failures. Names only served through a module
``__getattr__`` for deprecated constants (``_DEPRECATED_<NAME>``) are reported as
deprecated, also without failing.

Usage::

    scripts/check_ha_names                    # newest wheel from PyPI
    scripts/check_ha_names --version 2026.2.3 # a given release
    scripts/check_ha_names --wheel FILE.whl   # a wheel you already have

Prints the checked version and every missing ``module.name`` with where it is used;
exits 1 if anything is missing, 2 if no wheel could be obtained.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
import json
from pathlib import Path
import re
import subprocess
import sys
import tempfile
import urllib.request
import zipfile

ROOT = Path(__file__).resolve().parent.parent
COMPONENT = ROOT / "custom_components" / "rtvoice"
PYPI_JSON = "https://pypi.org/pypi/homeassistant/json"
OPTIONAL_MARK = "# compat: optional"
DEPRECATED_PREFIX = "_DEPRECATED_"
# --python-version for pip when PyPI's metadata is out of reach: newer than any
# Python, so pip picks the newest wheel whatever Python it requires.
ANY_FUTURE_PYTHON = "3.99"

_TOP_LEVEL_DEF = re.compile(
    r"^(?:async\s+def|def|class|type)\s+([A-Za-z_]\w*)"
    r"|^([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)"
    r"|^([A-Za-z_]\w*)\s*:"
)
_TOP_LEVEL_IMPORT = re.compile(r"^from\s+(\.*[\w.]*)\s+import\s+(.+)$")
_PLAIN_IMPORT = re.compile(r"^import\s+(.+)$")
# PEP 758 (Python 3.14): ``except A, B:`` without parentheses.
_BARE_EXCEPT_TUPLE = re.compile(
    r"^(\s*except\*?\s+)([^():\n]+,[^():\n]+):", re.MULTILINE
)


# ── what the component uses ──────────────────────────────────────────────────────


@dataclass(frozen=True)
class Use:
    """One HA name the component needs: ``name`` in ``module`` (None = the module)."""

    module: str
    name: str | None
    where: str  # path:line
    optional: bool = False

    @property
    def label(self) -> str:
        """``module.name`` (or just the module)."""
        return self.module if self.name is None else f"{self.module}.{self.name}"


@dataclass(frozen=True)
class ChainUse:
    """An attribute chain on an imported HA module: ``module.attrs[0].attrs[1]…``."""

    module: str
    attrs: tuple[str, ...]
    where: str
    optional: bool = False


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        kinds = handler.type
        names: list[ast.expr] = (
            []
            if kinds is None
            else list(kinds.elts)
            if isinstance(kinds, ast.Tuple)
            else [kinds]
        )
        if kinds is None or any(
            isinstance(n, ast.Name)
            and n.id in {"ImportError", "ModuleNotFoundError", "Exception"}
            for n in names
        ):
            return True
    return False


def _guarded_lines(tree: ast.AST) -> set[int]:
    """Lines inside the body of a ``try`` that catches ImportError."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and _catches_import_error(node):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def _attribute_chain(node: ast.Attribute) -> tuple[str, list[str]] | None:
    attrs: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        attrs.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return current.id, attrs[::-1]


def uses_in_source(source: str, path: str) -> tuple[list[Use], list[ChainUse]]:
    """Return the HA modules, names and attribute chains one source file uses."""
    tree = ast.parse(source, path)
    lines = source.splitlines()
    guarded = _guarded_lines(tree)

    def optional(node: ast.stmt | ast.expr) -> bool:
        first, last = node.lineno, node.end_lineno or node.lineno
        if first in guarded:
            return True
        return any(OPTIONAL_MARK in lines[i - 1] for i in range(first, last + 1))

    uses: list[Use] = []
    aliases: dict[str, str] = {}  # local name -> HA module (maybe a submodule guess)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "homeassistant":
                    continue
                where = f"{path}:{node.lineno}"
                uses.append(Use(alias.name, None, where, optional(node)))
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    aliases["homeassistant"] = "homeassistant"
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or module.split(".")[0] != "homeassistant":
                continue
            where = f"{path}:{node.lineno}"
            uses.append(Use(module, None, where, optional(node)))
            for alias in node.names:
                if alias.name == "*":
                    continue
                uses.append(Use(module, alias.name, where, optional(node)))
                # Maybe a submodule; attribute uses are checked if it is one.
                aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
    chains: list[ChainUse] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain = _attribute_chain(node)
        if chain is None or chain[0] not in aliases:
            continue
        base, attrs = chain
        chains.append(
            ChainUse(
                aliases[base], tuple(attrs), f"{path}:{node.lineno}", optional(node)
            )
        )
    return uses, chains


def component_uses(component: Path) -> tuple[list[Use], list[ChainUse]]:
    """Return every HA use of every ``.py`` file under ``component``."""
    uses: list[Use] = []
    chains: list[ChainUse] = []
    for file in sorted(component.rglob("*.py")):
        try:
            rel = str(file.relative_to(ROOT))
        except ValueError:
            rel = str(file)
        file_uses, file_chains = uses_in_source(file.read_text(encoding="utf-8"), rel)
        uses += file_uses
        chains += file_chains
    return uses, chains


# ── what the wheel defines ───────────────────────────────────────────────────────


@dataclass
class ModuleInfo:
    """Module-level names of one module of the wheel."""

    names: set[str] = field(default_factory=set)
    star_from: list[str] = field(default_factory=list)  # absolute module names
    all_names: set[str] | None = None

    @property
    def deprecated(self) -> set[str]:
        """Names served by a deprecation ``__getattr__``."""
        return {
            n.removeprefix(DEPRECATED_PREFIX)
            for n in self.names
            if n.startswith(DEPRECATED_PREFIX)
        }

    def public(self) -> set[str]:
        """Return what ``from module import *`` binds."""
        if self.all_names is not None:
            return self.all_names
        return {n for n in self.names if not n.startswith("_")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _target_names(element)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def _resolve_relative(
    module: str, is_package: bool, level: int, name: str | None
) -> str:
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, name] if name else parts)


def _collect(
    body: Iterable[ast.stmt], info: ModuleInfo, module: str, is_package: bool
) -> None:
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            info.names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                info.names.update(_target_names(target))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                info.all_names = _literal_strings(node.value)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            info.names.update(_target_names(node.target))
            if (
                isinstance(node, ast.AugAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id == "__all__"
            ):
                info.all_names = (info.all_names or set()) | (
                    _literal_strings(node.value) or set()
                )
        elif isinstance(node, ast.TypeAlias):
            info.names.update(_target_names(node.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                info.names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            source = (
                _resolve_relative(module, is_package, node.level, node.module)
                if node.level
                else node.module or ""
            )
            for alias in node.names:
                if alias.name == "*":
                    info.star_from.append(source)
                else:
                    info.names.add(alias.asname or alias.name)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                _collect(node.body, info, module, is_package)
            _collect(node.orelse, info, module, is_package)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                _collect(block, info, module, is_package)
            for handler in node.handlers:
                _collect(handler.body, info, module, is_package)
        elif isinstance(node, ast.With | ast.AsyncWith):
            _collect(node.body, info, module, is_package)


def _literal_strings(value: ast.expr) -> set[str] | None:
    if isinstance(value, ast.List | ast.Tuple | ast.Set):
        return {
            e.value
            for e in value.elts
            if isinstance(e, ast.Constant) and isinstance(e.value, str)
        }
    return None


def parse_newer(source: str, path: str) -> ast.Module | None:
    """Parse source written for a newer Python, or None if this one cannot.

    Syntax this Python lacks but that does not change module-level names is
    rewritten first (PEP 758 bare exception tuples).
    """
    try:
        return ast.parse(source, path)
    except SyntaxError:
        pass
    try:
        return ast.parse(_BARE_EXCEPT_TUPLE.sub(r"\1(\2):", source), path)
    except SyntaxError:
        return None


def _scan_without_ast(
    source: str, info: ModuleInfo, module: str, is_package: bool
) -> None:
    """Fallback for source this Python cannot parse (newer syntax): column-0 lines."""
    lines = source.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if match := _TOP_LEVEL_IMPORT.match(line):
            source_module, names = match.groups()
            if names.strip().startswith("("):
                while ")" not in names and index < len(lines):
                    names += " " + lines[index]
                    index += 1
            level = len(source_module) - len(source_module.lstrip("."))
            target = (
                _resolve_relative(
                    module, is_package, level, source_module.lstrip(".") or None
                )
                if level
                else source_module
            )
            for part in names.strip().strip("()").split(","):
                words = part.split("#")[0].split()
                if not words:
                    continue
                if words[0] == "*":
                    info.star_from.append(target)
                else:
                    info.names.add(words[-1])
        elif match := _PLAIN_IMPORT.match(line):
            for part in match.group(1).split(","):
                words = part.split()
                if words:
                    info.names.add(
                        words[-1] if "as" in words else words[0].split(".")[0]
                    )
        elif match := _TOP_LEVEL_DEF.match(line):
            info.names.add(next(g for g in match.groups() if g))


class WheelIndex:
    """The modules of a Home Assistant wheel, parsed on demand."""

    def __init__(self, wheel: zipfile.ZipFile) -> None:
        """Index the files of an open wheel."""
        self._wheel = wheel
        self._files = set(wheel.namelist())
        self._packages = {
            "/".join(parts[:i])
            for name in self._files
            for parts in [name.split("/")]
            for i in range(1, len(parts))
        }
        self._cache: dict[str, ModuleInfo | None] = {}
        self.unparsable: list[str] = []

    def _file_of(self, module: str) -> tuple[str | None, bool]:
        base = module.replace(".", "/")
        if f"{base}/__init__.py" in self._files:
            return f"{base}/__init__.py", True
        if f"{base}.py" in self._files:
            return f"{base}.py", False
        return None, base in self._packages  # namespace package or nothing

    def is_module(self, module: str) -> bool:
        """Whether the wheel has this module (file, package or namespace package)."""
        path, package = self._file_of(module)
        return path is not None or package

    def info(self, module: str) -> ModuleInfo | None:
        """Module-level names of a module, or None if the wheel lacks it."""
        if module in self._cache:
            return self._cache[module]
        path, is_package = self._file_of(module)
        result: ModuleInfo | None
        if path is None:
            result = ModuleInfo() if is_package else None
        else:
            source = self._wheel.read(path).decode("utf-8")
            result = ModuleInfo()
            tree = parse_newer(source, path)
            if tree is None:
                self.unparsable.append(path)
                _scan_without_ast(source, result, module, is_package)
            else:
                _collect(tree.body, result, module, is_package)
        self._cache[module] = result
        return result

    def lookup(self, module: str, name: str) -> str:
        """``"ok"``, ``"deprecated"`` or ``"missing"`` for ``name`` in ``module``."""
        info = self.info(module)
        if info is None:
            return "missing"
        if name in info.names or self.is_module(f"{module}.{name}"):
            return "ok"
        for star in info.star_from:  # one level of re-exports
            star_info = self.info(star)
            if star_info is not None and name in star_info.public():
                return "ok"
        if name in info.deprecated:
            return "deprecated"
        return "missing"


# ── the check ───────────────────────────────────────────────────────────────────


@dataclass
class Report:
    """Outcome of a check."""

    checked: int = 0
    missing: dict[str, list[str]] = field(default_factory=dict)
    deprecated: dict[str, list[str]] = field(default_factory=dict)
    optional_missing: dict[str, list[str]] = field(default_factory=dict)

    def add(self, status: str, label: str, where: str, optional: bool) -> None:
        """Record the status of one use."""
        self.checked += 1
        if status == "ok":
            return
        if optional:
            target = self.optional_missing
        elif status == "deprecated":
            target = self.deprecated
        else:
            target = self.missing
        target.setdefault(label, []).append(where)


def check(index: WheelIndex, uses: Sequence[Use], chains: Sequence[ChainUse]) -> Report:
    """Look every use up in the wheel."""
    report = Report()
    for use in uses:
        if use.name is None:
            status = "ok" if index.is_module(use.module) else "missing"
        elif not index.is_module(use.module):
            continue  # reported once as a missing module
        else:
            status = index.lookup(use.module, use.name)
        report.add(status, use.label, use.where, use.optional)
    for chain in chains:
        module = chain.module
        if not index.is_module(module):
            continue  # a name, not a module; checked as an import
        for attr in chain.attrs:
            if index.is_module(f"{module}.{attr}") and (
                (info := index.info(module)) is None or attr not in info.names
            ):
                module = f"{module}.{attr}"  # a submodule: keep walking
                continue
            report.add(
                index.lookup(module, attr),
                f"{module}.{attr}",
                chain.where,
                chain.optional,
            )
            break
    return report


def wheel_version(path: Path) -> str:
    """Return the version in a wheel's file name (``name-version-…whl``)."""
    return path.name.split("-")[1]


def _newest_on_pypi() -> tuple[str, str] | None:
    """Return the newest release and its minimum Python from PyPI (or None)."""
    try:
        with urllib.request.urlopen(PYPI_JSON, timeout=30) as response:
            info = json.load(response)["info"]
    except (OSError, ValueError, KeyError) as err:
        print(f"PyPI JSON API unavailable ({err}); asking pip", file=sys.stderr)
        return None
    minimum = re.search(r">=\s*([\d.]+)", info.get("requires_python") or "")
    return info["version"], minimum.group(1) if minimum else ANY_FUTURE_PYTHON


def download_wheel(target: Path, version: str | None) -> Path:
    """Download a homeassistant wheel (newest unless ``version``) with pip.

    pip, not a raw HTTP request, so the machine's pip configuration (index, proxy,
    certificates) applies. Nothing is installed.
    """
    python = ANY_FUTURE_PYTHON
    if version is None and (newest := _newest_on_pypi()) is not None:
        version, python = newest
    requirement = f"homeassistant=={version}" if version else "homeassistant"
    command = [
        sys.executable, "-m", "pip", "download", requirement, "--no-deps",
        "--only-binary=:all:", "--python-version", python, "--disable-pip-version-check",
        "--quiet", "-d", str(target),
    ]  # fmt: skip
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    for line in (done.stdout + done.stderr).splitlines():
        # This machine's pip config names local index folders that may not exist.
        if not line.startswith("WARNING: Location 'file://"):
            print(line, file=sys.stderr)
    done.check_returncode()
    wheels = sorted(target.glob("homeassistant-*.whl"))
    if not wheels:
        raise FileNotFoundError("pip downloaded no homeassistant wheel")
    return wheels[-1]


def run(wheel_path: Path, component: Path) -> int:
    """Check the component against a wheel; print the report; return the exit code."""
    uses, chains = component_uses(component)
    with zipfile.ZipFile(wheel_path) as wheel:
        index = WheelIndex(wheel)
        report = check(index, uses, chains)
    print(f"homeassistant {wheel_version(wheel_path)}: {report.checked} uses checked")
    for path in index.unparsable:
        print(f"note: {path} needs a newer Python to parse; scanned by lines")
    for title, entries in (
        ("optional (version-guarded) names absent", report.optional_missing),
        ("deprecated names (still served, will go away)", report.deprecated),
        ("MISSING", report.missing),
    ):
        if entries:
            print(f"{title}:")
            for label in sorted(entries):
                print(f"  {label}  ({', '.join(sorted(set(entries[label])))})")
    if report.missing:
        print(f"{len(report.missing)} missing name(s)")
        return 1
    print("every homeassistant name the component uses exists")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="check this wheel (no download)")
    parser.add_argument("--version", help="download this homeassistant release")
    parser.add_argument(
        "--component", type=Path, default=COMPONENT, help="integration folder to check"
    )
    args = parser.parse_args(argv)
    if args.wheel is not None:
        return run(args.wheel, args.component)
    with tempfile.TemporaryDirectory(prefix="check_ha_names-") as tmp:
        try:
            wheel = download_wheel(Path(tmp), args.version)
        except (subprocess.CalledProcessError, FileNotFoundError) as err:
            print(
                f"error: could not download a homeassistant wheel: {err}",
                file=sys.stderr,
            )
            return 2
        return run(wheel, args.component)


if __name__ == "__main__":
    sys.exit(main())
