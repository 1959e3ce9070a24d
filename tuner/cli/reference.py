"""References generated from the code: the study file, the ``tune`` command line, the catalog.

The docs site includes what these functions return (``docs/conf.py`` writes it at build time), so
the reference is never kept by hand: a field's type, default and bounds come from its dataclass,
its text from the docstring under it, an option's text from the argument parser. The tests call
``missing_field_docs`` and ``missing_option_help`` so that nothing ships undocumented.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal

from tuner._loader import file_fields
from tuner.spec import bounds

_BOUND_CALLS = {"_positive": "> 0", "_size": "> 0", "_at_most": "<="}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FieldDoc:
    """One field of a study-file section, as the reference shows it."""

    path: str
    """YAML path, such as ``cluster.slurm.partition``."""
    type: str
    """The type in YAML words (``list of int``, ``"auto"``, ``null``)."""
    default: str
    """The default in YAML, or ``required``."""
    bounds: str
    """The checks ``__post_init__`` makes on the field alone (empty when none)."""
    doc: str
    """The docstring under the field."""


def _study_root() -> type:
    from tuner.spec.study import StudySpec

    return StudySpec


@functools.cache
def field_docstrings(cls: type) -> dict[str, str]:
    """``{field: docstring}`` from the string literal under each annotated field of ``cls``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            out[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return out


def _limit_text(node: ast.expr) -> str:
    """A bound's limit as a number: a name from ``tuner.spec.bounds`` or a constant expression."""
    if isinstance(node, ast.Name) and hasattr(bounds, node.id):
        return f"{getattr(bounds, node.id):,}"
    try:  # constants and the bounds' names only (`MAX_MINUTES * 60`)
        value = eval(compile(ast.Expression(node), "<bound>", "eval"), {}, vars(bounds))
    except Exception:  # a name we cannot evaluate: show it as written
        return ast.unparse(node)
    return f"{value:,}"


def _self_field(node: ast.expr) -> str | None:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def _loops(tree: ast.AST) -> dict[int, list[str]]:
    """Calls inside ``for NAME in ("a", "b"): ...`` loops: id(call) -> the fields NAME takes
    there (``getattr(self, NAME)`` in the call)."""
    out: dict[int, list[str]] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and isinstance(node.iter, ast.Tuple)
            and all(isinstance(e, ast.Constant) for e in node.iter.elts)
        ):
            names = [str(e.value) for e in node.iter.elts]  # type: ignore[attr-defined]
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and sub.args and _is_getattr(sub.args[0]):
                    out[id(sub)] = names
    return out


def _is_getattr(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) == 2
    )


_INVERSE = {ast.Lt: ">=", ast.LtE: ">", ast.Gt: "<=", ast.GtE: "<"}
_OPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def _side(node: ast.expr) -> str:
    """One side of a comparison: the field as written, a limit as its number."""
    return ast.unparse(node) if _self_field(node) else _limit_text(node)


def _allowed(test: ast.expr) -> str:
    """What must hold for a raising ``if TEST`` not to raise, in the field's words."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        if _self_field(test.operand):  # `if not self.nodes: raise`
            return "not empty"
        cmp = test.operand  # `not 0 <= self.x <= 1 << 20`
        if isinstance(cmp, ast.Compare) and all(type(op) in _OPS for op in cmp.ops):
            words = [_side(cmp.left)]
            for cmp_op, right in zip(cmp.ops, cmp.comparators, strict=True):
                words += [_OPS[type(cmp_op)], _side(right)]
            return " ".join(words)
        return ast.unparse(test.operand)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _INVERSE:
        op = _INVERSE[type(test.ops[0])]
        return f"{_side(test.left)} {op} {_side(test.comparators[0])}"
    if (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.And)
        and len(test.values) == 2
        and isinstance(first := test.values[0], ast.Compare)
        and isinstance(first.ops[0], ast.IsNot)
    ):
        return _allowed(test.values[1])  # "X is not None and BAD": only a given value is checked
    return f"not ({ast.unparse(test)})"


def _fields_of(call: ast.Call, loops: dict[int, list[str]]) -> list[str]:
    """The fields a bound call checks: ``self.NAME``, or each field of its loop."""
    if (name := _self_field(call.args[0])) is not None:
        return [name]
    return loops.get(id(call), [])


def _if_rule(node: ast.If) -> tuple[str, str] | None:
    """``(field, rule)`` of an ``if`` on one field and constants alone that raises."""
    if not any(isinstance(s, ast.Raise) for s in node.body):
        return None
    names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
    fields = {f for n in ast.walk(node.test) if isinstance(n, ast.expr) and (f := _self_field(n))}
    if names != {"self"} or len(fields) != 1:
        return None
    return fields.pop(), _allowed(node.test).replace("self.", "")


@functools.cache
def field_bounds(cls: type) -> dict[str, str]:
    """The checks ``cls.__post_init__`` makes on one field: ``_positive``, ``_size``,
    ``_at_most`` calls and ``if`` tests on one field and constants that raise."""
    post = getattr(cls, "__post_init__", None)
    if post is None:
        return {}
    tree = ast.parse(textwrap.dedent(inspect.getsource(post)))
    loops = _loops(tree)
    out: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            kind = _BOUND_CALLS.get(node.func.id)
            for name in _fields_of(node, loops) if kind else []:
                rules = out.setdefault(name, [])
                if kind == "> 0":
                    rules.append("> 0")
                if node.func.id != "_positive":
                    rules.append(f"<= {_limit_text(node.args[1])}")
        elif isinstance(node, ast.If) and (found := _if_rule(node)) is not None:
            out.setdefault(found[0], []).append(found[1])
    return {name: "; ".join(dict.fromkeys(rules)) for name, rules in out.items()}


def type_text(tp: Any) -> str:
    """A type hint in the words of a YAML file."""
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(type_text(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {type_text(typing.get_args(tp)[0])}"
    if origin is dict:
        key, value = typing.get_args(tp)
        return f"map of {type_text(key)} to {type_text(value)}"
    if dataclasses.is_dataclass(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


def _yaml(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _default_text(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{_yaml(f.default)}`"
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "see below" if dataclasses.is_dataclass(value) else f"`{_yaml(value)}`"
    return "required"


def _sections(cls: type, path: str) -> Iterator[tuple[str, type]]:
    """``(yaml path, dataclass)`` of ``cls`` and every section nested in it, depth first."""
    yield path, cls
    hints = typing.get_type_hints(cls)
    for f in file_fields(cls):
        for arg in (hints[f.name], *typing.get_args(hints[f.name])):
            if dataclasses.is_dataclass(arg) and isinstance(arg, type):
                yield from _sections(arg, f"{path}.{f.name}" if path else f.name)


def study_fields() -> list[FieldDoc]:
    """Every field of the study file, section by section."""
    out: list[FieldDoc] = []
    for path, cls in _sections(_study_root(), ""):
        hints = typing.get_type_hints(cls)
        docs, rules = field_docstrings(cls), field_bounds(cls)
        for f in file_fields(cls):
            out.append(
                FieldDoc(
                    path=f"{path}.{f.name}" if path else f.name,
                    type=type_text(hints[f.name]),
                    default=_default_text(f),
                    bounds=rules.get(f.name, ""),
                    doc=docs.get(f.name, ""),
                )
            )
    return out


def missing_field_docs() -> list[str]:
    """YAML paths of study fields with no docstring."""
    return [f.path for f in study_fields() if not f.doc.strip()]


def _md(text: str) -> str:
    """Docstring reStructuredText to one line of Markdown."""
    text = " ".join(text.split())
    for role in (":mod:", ":class:", ":func:", ":data:"):
        text = text.replace(role, "")
    return text.replace("``", "`").replace("|", "\\|")


def study_reference() -> str:
    """The study-file reference, in Markdown: one table per section."""
    from tuner.spec.file import model_preset_names

    lines: list[str] = []
    for path, cls in _sections(_study_root(), ""):
        title = f"`{path}`" if path else "Top level"
        lines += [f"## {title}", "", _md(inspect.cleandoc(cls.__doc__ or "")), ""]
        if path == "model":
            names = ", ".join(f"`{n}`" for n in model_preset_names())
            lines += [
                f"`model.preset` starts from a catalog model ({names}); any field below given "
                "next to it overrides the preset's value.",
                "",
            ]
        lines += ["| field | type | default | bounds | meaning |", "|---|---|---|---|---|"]
        for f in study_fields():
            if f.path.rpartition(".")[0] == path:
                rule = f"`{f.bounds}`" if f.bounds else ""
                name = f.path.rpartition(".")[2]
                lines.append(f"| `{name}` | {f.type} | {f.default} | {rule} | {_md(f.doc)} |")
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------- the command line


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _documented(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]


def missing_option_help(parser: argparse.ArgumentParser | None = None) -> list[str]:
    """``command --option`` for every option (and subcommand) of ``tune`` with no help text."""
    parser = parser or _tune_parser()
    out = [f"tune {a.option_strings[0]}" for a in _documented(parser) if not a.help]
    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help for c in action._choices_actions}
    for name, sub in _subcommands(parser).items():
        if not helps.get(name):
            out.append(f"tune {name}")
        for a in _documented(sub):
            if not a.help or a.help == argparse.SUPPRESS:
                out.append(f"tune {name} {(a.option_strings or [a.dest])[0]}")
    return out


def _tune_parser() -> argparse.ArgumentParser:
    from tuner.cli.commands import build_parser

    return build_parser()[0]


def _option_row(a: argparse.Action) -> str:
    names = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.metavar or a.dest}`"
    if a.option_strings and a.nargs != 0:
        metavar = a.metavar or (
            "{" + ",".join(map(str, a.choices)) + "}" if a.choices else a.dest.upper()
        )
        names += f" `{metavar}`"
    default = "" if a.default in (None, False, "", argparse.SUPPRESS) else f"`{a.default}`"
    required = "required" if a.required else default
    help_text = (a.help or "").replace("%%", "%").replace("|", "\\|")
    return f"| {names} | {required} | {help_text} |"


def _said(text: str) -> str:
    """``text`` as a sentence says it: a help line and the description that only capitalises it
    and adds a full stop say the same."""
    return " ".join(text.split()).rstrip(".").lower()


def cli_reference() -> str:
    """The ``tune`` reference, in Markdown, from the argument parser."""
    parser = _tune_parser()
    lines = [
        "## Global options",
        "",
        "They go before or after the command (`tune --debug run ...` or `tune run ... --debug`).",
        "",
        "| option | default | meaning |",
        "|---|---|---|",
        *(_option_row(a) for a in _documented(parser)),
        "",
    ]
    global_dests = {a.dest for a in _documented(parser)}
    helps: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in action._choices_actions}
    for name, sub in _subcommands(parser).items():
        usage = " ".join(sub.format_usage().split())
        usage = usage.removeprefix("usage: ")
        lines += [f"## `tune {name}`", "", helps.get(name, ""), ""]
        if sub.description and _said(sub.description) != _said(helps.get(name, "")):
            lines += [sub.description, ""]  # more than the one-line help says
        lines += ["```text", usage, "```", "", "| option | default | meaning |", "|---|---|---|"]
        lines += [_option_row(a) for a in _documented(sub) if a.dest not in global_dests]
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------- the catalog


def catalog_reference() -> str:
    """The GPU catalog and the model presets, in Markdown."""
    from tuner._loader import load_dataclass
    from tuner.catalog import get_gpu, gpu_names
    from tuner.spec.file import _model_presets
    from tuner.spec.model import ModelSpec

    lines = [
        "## GPUs",
        "",
        "`cluster.gpu` names one of these (`tuner/catalog/gpus.yaml` cites each figure's source).",
        "",
        "| name | memory GiB | peak TFLOP/s (16-bit) | FP8 TFLOP/s | HBM GB/s | "
        "NVLink GB/s | network GB/s | compute capability | SMs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in gpu_names():
        g = get_gpu(name)
        lines.append(
            f"| `{name}` | {g.memory_gib:g} | {g.peak_tflops:g} | {g.fp8_peak_tflops:g} | "
            f"{g.hbm_gbps:g} | {g.intra_node_gbps:g} | {g.inter_node_gbps:g} | "
            f"{g.compute_capability:g} | {g.sm_count} |"
        )
    lines += [
        "",
        "## Models",
        "",
        "`model.preset` names one of these (`tuner/catalog/models.yaml` cites each shape's "
        "source).",
        "",
        "| name | layers | hidden | FFN | heads | KV groups | vocab | seq | SwiGLU | experts |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, raw in sorted(_model_presets().items()):
        m = load_dataclass(ModelSpec, {"name": name, **raw}, f"models.{name}")
        experts = f"{m.moe.num_experts} (top-{m.moe.router_topk})" if m.moe else ""
        lines.append(
            f"| `{name}` | {m.num_layers} | {m.hidden_size} | {m.ffn_hidden_size} | "
            f"{m.num_attention_heads} | {m.num_query_groups or m.num_attention_heads} | "
            f"{m.vocab_size} | {m.seq_length} | {'yes' if m.swiglu else 'no'} | {experts} |"
        )
    lines.append("")
    return "\n".join(lines)
