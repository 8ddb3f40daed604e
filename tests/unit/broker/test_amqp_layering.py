"""The AMQP adapter's modules import only modules below them (docs/amqp.md, "Code layout"),
counting every import: under ``if TYPE_CHECKING:`` and inside functions too."""

import ast
from pathlib import Path

import flowmq_broker.amqp

PACKAGE = "flowmq_broker.amqp"
# Bottom to top; a module may import only those before it.
LAYERS = [
    "errors",
    "limits",
    "messages",
    "exchanges",
    "memqueue",
    "link",
    "state",
    "topology",
    "consumers",
    "channel",
    "connection",
    "server",
]


def _amqp_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                found.update(alias.name for alias in node.names)
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(
                alias.name.split(".")[2]
                for alias in node.names
                if alias.name.startswith(PACKAGE + ".")
            )
    return found


def test_amqp_modules_import_only_lower_layers():
    directory = Path(flowmq_broker.amqp.__file__).parent
    modules = {p.stem for p in directory.glob("*.py")} - {"__init__"}
    assert modules == set(LAYERS), "a module was added or removed: place it in LAYERS"
    upward = [
        f"{name} imports {imported}"
        for name in LAYERS
        for imported in sorted(_amqp_imports(directory / f"{name}.py"))
        if LAYERS.index(imported) >= LAYERS.index(name)
    ]
    assert upward == []


def test_amqp_layering_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "channel.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from flowmq_broker.amqp.connection import AmqpConnection\n"
        "from flowmq_broker.amqp import errors\n"
    )
    assert _amqp_imports(module) == {"connection", "errors"}
